//! Bearer tokens and upload capabilities, both HMAC-SHA256 under the cluster secret.
//!
//! A bearer token is `nokv1.<hex(claims json)>.<hex(mac)>`. The claims name the workspace
//! patterns the token may touch, its role and its expiry; the MAC covers the exact claim bytes,
//! so nothing in a token can be changed without the secret. Tokens are never logged: `Debug`
//! of [`Claims`] is fine (no secret in it), but the token string itself is only ever compared.

use std::time::{SystemTime, UNIX_EPOCH};

use ring::hmac;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

const PREFIX: &str = "nokv1";

/// Roles are ordered: a higher role can do everything a lower one can.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Read,
    Write,
    Admin,
}

impl std::str::FromStr for Role {
    type Err = Error;
    fn from_str(s: &str) -> Result<Role> {
        match s {
            "read" => Ok(Role::Read),
            "write" => Ok(Role::Write),
            "admin" => Ok(Role::Admin),
            _ => Err(Error::InvalidArgument(format!(
                "role {s:?} is not one of read, write, admin"
            ))),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Claims {
    /// Workspace patterns: an exact name, `prefix*`, or `*` for every workspace.
    #[serde(rename = "w")]
    pub workspaces: Vec<String>,
    #[serde(rename = "r")]
    pub role: Role,
    /// Expiry in seconds since the Unix epoch.
    #[serde(rename = "e")]
    pub expires: u64,
}

impl Claims {
    pub fn allows_workspace(&self, ws: &str) -> bool {
        self.workspaces.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => ws.starts_with(prefix),
            None => p == ws,
        })
    }

    /// Authorises one call: the workspace must match a pattern and the role must suffice.
    /// A refusal says what the token does cover (its patterns and role — claims its holder
    /// can read anyway, never the token or its MAC), so the caller knows which token to use.
    pub fn require(&self, ws: &str, role: Role) -> Result<()> {
        if !self.allows_workspace(ws) {
            return Err(Error::PermissionDenied(format!(
                "token is not valid for workspace {ws:?}: it covers {}",
                self.coverage()
            )));
        }
        if self.role < role {
            return Err(Error::PermissionDenied(format!(
                "token role {:?} cannot perform a {:?} operation: it covers {}",
                self.role,
                role,
                self.coverage()
            )));
        }
        Ok(())
    }

    /// What the token covers, in words: `workspaces "team-*" with role write`.
    pub fn coverage(&self) -> String {
        let patterns: Vec<String> = self.workspaces.iter().map(|w| format!("{w:?}")).collect();
        let role = match self.role {
            Role::Read => "read",
            Role::Write => "write",
            Role::Admin => "admin",
        };
        let noun = if patterns.len() == 1 {
            "workspace"
        } else {
            "workspaces"
        };
        format!("{noun} {} with role {role}", patterns.join(", "))
    }
}

/// The cluster secret as an HMAC key. Cloning shares the key; the bytes are never exposed.
#[derive(Clone)]
pub struct Signer {
    key: hmac::Key,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer(<secret>)")
    }
}

impl Signer {
    pub fn new(secret: &[u8]) -> Signer {
        Signer {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
        }
    }

    pub fn issue(&self, claims: &Claims) -> String {
        let body = serde_json::to_vec(claims).expect("claims serialise");
        let mac = hmac::sign(&self.key, &body);
        format!(
            "{PREFIX}.{}.{}",
            hex::encode(&body),
            hex::encode(mac.as_ref())
        )
    }

    /// Verifies signature and expiry. Every failure is `Unauthenticated` and says why without
    /// echoing the token.
    pub fn verify(&self, token: &str) -> Result<Claims> {
        let bad = |why: &str| Error::Unauthenticated(format!("invalid token: {why}"));
        let mut parts = token.split('.');
        let (Some(PREFIX), Some(body), Some(mac), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad("malformed"));
        };
        let body = hex::decode(body).map_err(|_| bad("malformed"))?;
        let mac = hex::decode(mac).map_err(|_| bad("malformed"))?;
        hmac::verify(&self.key, &body, &mac).map_err(|_| bad("bad signature"))?;
        let claims: Claims = serde_json::from_slice(&body).map_err(|_| bad("malformed claims"))?;
        if claims.expires <= unix_now() {
            return Err(Error::Unauthenticated("token expired".into()));
        }
        Ok(claims)
    }

    /// The capability for one upload: whoever holds it may put blocks into, renew, commit or
    /// abort exactly that upload (bearer scope is still checked against its workspace).
    pub fn upload_capability(&self, upload_id: &str) -> String {
        let mac = hmac::sign(&self.key, format!("upload:{upload_id}").as_bytes());
        hex::encode(mac.as_ref())
    }

    pub fn verify_upload_capability(&self, upload_id: &str, capability: &str) -> Result<()> {
        let mac = hex::decode(capability)
            .map_err(|_| Error::PermissionDenied("invalid upload token".into()))?;
        hmac::verify(&self.key, format!("upload:{upload_id}").as_bytes(), &mac)
            .map_err(|_| Error::PermissionDenied("upload token does not match this upload".into()))
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Parses `30d`, `12h`, `15m`, `90s`, `250ms` or a bare number of seconds. A value whose
/// length does not fit in the duration type is refused, never wrapped.
pub fn parse_duration(s: &str) -> Result<std::time::Duration> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| Error::InvalidArgument(format!("bad duration {s:?}")))?;
    let per_unit = match unit {
        "ms" => return Ok(std::time::Duration::from_millis(n)),
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => {
            return Err(Error::InvalidArgument(format!(
                "bad duration unit in {s:?}"
            )));
        }
    };
    let secs = n
        .checked_mul(per_unit)
        .ok_or_else(|| Error::InvalidArgument(format!("duration {s:?} is too large")))?;
    Ok(std::time::Duration::from_secs(secs))
}

/// The shortest lifetime `token issue` grants. A shorter one is almost dead when printed
/// (expiry has one-second resolution and `0s` would be dead at once), which only ever hides a
/// typo; a minute is the least a person can use a token within.
pub const MIN_TOKEN_TTL: std::time::Duration = std::time::Duration::from_secs(60);

/// The expiry (seconds since the epoch) of a token issued now with lifetime `ttl`: refused
/// below [`MIN_TOKEN_TTL`] and when the sum does not fit, so no lifetime wraps around.
pub fn token_expiry(ttl: std::time::Duration) -> Result<u64> {
    if ttl < MIN_TOKEN_TTL {
        return Err(Error::InvalidArgument(format!(
            "--ttl {ttl:?} is shorter than the minimum of {}s: the token would be dead or almost \
             dead when issued",
            MIN_TOKEN_TTL.as_secs()
        )));
    }
    unix_now()
        .checked_add(ttl.as_secs())
        .ok_or_else(|| Error::InvalidArgument("--ttl is too large".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(ws: &str, role: Role, expires: u64) -> Claims {
        Claims {
            workspaces: vec![ws.into()],
            role,
            expires,
        }
    }

    #[test]
    fn a_token_verifies_only_under_its_own_secret_and_before_expiry() {
        let a = Signer::new(b"secret-a");
        let b = Signer::new(b"secret-b");
        let t = a.issue(&claims("ws", Role::Write, unix_now() + 60));
        assert_eq!(a.verify(&t).unwrap().role, Role::Write);
        assert!(matches!(b.verify(&t), Err(Error::Unauthenticated(_))));
        let expired = a.issue(&claims("ws", Role::Write, unix_now() - 1));
        assert!(matches!(a.verify(&expired), Err(Error::Unauthenticated(_))));
        assert!(matches!(
            a.verify("garbage"),
            Err(Error::Unauthenticated(_))
        ));
    }

    #[test]
    fn scope_is_checked_by_workspace_pattern_and_role() {
        let c = claims("team-*", Role::Read, 0);
        assert!(c.require("team-a", Role::Read).is_ok());
        let Err(Error::PermissionDenied(why)) = c.require("other", Role::Read) else {
            panic!("refused");
        };
        assert!(
            why.ends_with(r#"it covers workspace "team-*" with role read"#),
            "{why}"
        );
        assert!(matches!(
            c.require("team-a", Role::Write),
            Err(Error::PermissionDenied(_))
        ));
        assert!(matches!(
            c.require("other", Role::Read),
            Err(Error::PermissionDenied(_))
        ));
    }

    #[test]
    fn a_token_lifetime_that_overflows_or_is_nearly_dead_is_refused_not_wrapped() {
        assert!(parse_duration("213503982334602d").is_err());
        assert!(parse_duration(&format!("{}h", u64::MAX / 3600 + 1)).is_err());
        assert_eq!(parse_duration("2h").unwrap().as_secs(), 7200);
        for ttl in ["0", "0s", "1ms", "59s"] {
            assert!(token_expiry(parse_duration(ttl).unwrap()).is_err(), "{ttl}");
        }
        assert!(token_expiry(parse_duration(&format!("{}s", u64::MAX)).unwrap()).is_err());
        assert!(token_expiry(parse_duration("1m").unwrap()).unwrap() > unix_now());
    }

    #[test]
    fn upload_capability_is_bound_to_one_upload() {
        let s = Signer::new(b"k");
        let cap = s.upload_capability("u1");
        assert!(s.verify_upload_capability("u1", &cap).is_ok());
        assert!(s.verify_upload_capability("u2", &cap).is_err());
    }
}
