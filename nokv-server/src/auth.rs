//! Per-call authentication: the bearer token from the `authorization` metadata, verified
//! against the cluster secret. Authorisation (workspace scope and role) is checked by the
//! service against the claims, once the workspace of the call is known.

use tonic::Request;

use crate::error::{Error, Result};
use crate::token::{Claims, Signer};

pub fn authenticate<T>(signer: &Signer, req: &Request<T>) -> Result<Claims> {
    let value = req
        .metadata()
        .get("authorization")
        .ok_or_else(|| Error::Unauthenticated("missing bearer token".into()))?;
    let text = value
        .to_str()
        .map_err(|_| Error::Unauthenticated("invalid token: not ascii".into()))?;
    let token = text
        .strip_prefix("Bearer ")
        .or_else(|| text.strip_prefix("bearer "))
        .ok_or_else(|| Error::Unauthenticated("authorization is not a Bearer token".into()))?;
    signer.verify(token.trim())
}

/// [`authenticate`], also returning the token's id for audit events
/// ([`crate::events::token_id`]; never the token itself).
pub fn authenticate_with_id<T>(signer: &Signer, req: &Request<T>) -> Result<(Claims, String)> {
    let claims = authenticate(signer, req)?;
    let token = req
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(|t| {
            t.strip_prefix("Bearer ")
                .or_else(|| t.strip_prefix("bearer "))
                .unwrap_or(t)
                .trim()
        })
        .unwrap_or_default();
    Ok((claims, crate::events::token_id(token)))
}
