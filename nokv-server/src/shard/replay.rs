//! Request-id replay: the outcome of every mutation is recorded under (workspace, request id)
//! together with the request's fingerprint, inside the same write session as the mutation.
//! A retry with the same id and fingerprint gets the recorded response and changes nothing;
//! the same id with another fingerprint is refused.

use prost::Message;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::meta::{ReplayRecord, WriteView};

/// Identifies one client mutation for replay.
#[derive(Debug, Clone)]
pub struct RequestKey {
    pub workspace: String,
    pub request_id: String,
    pub fingerprint: Vec<u8>,
}

impl RequestKey {
    /// `op` names the operation so that the same id on two operations never collides;
    /// `request` is the wire request with its request id cleared. Computed before any gate.
    pub fn new(workspace: &str, request_id: &str, op: &str, request: &impl Message) -> RequestKey {
        let mut h = Sha256::new();
        h.update(op.as_bytes());
        h.update([0]);
        h.update(request.encode_to_vec());
        RequestKey {
            workspace: workspace.to_string(),
            request_id: request_id.to_string(),
            fingerprint: h.finalize().to_vec(),
        }
    }

    /// The recorded response of this request, if any.
    pub fn recorded<R: Message + Default>(&self, w: &WriteView) -> Result<Option<R>> {
        let Some(rec) = w.replay(&self.workspace, &self.request_id)? else {
            return Ok(None);
        };
        if rec.fingerprint != self.fingerprint {
            return Err(Error::RequestIdReused(format!(
                "request id {:?} was already used for a different request",
                self.request_id
            )));
        }
        R::decode(rec.response.as_slice())
            .map(Some)
            .map_err(|e| Error::Internal(format!("recorded outcome is corrupt: {e}")))
    }

    pub fn record<R: Message>(&self, w: &mut WriteView, response: &R, now_ms: i64) -> Result<()> {
        let rec = ReplayRecord {
            fingerprint: self.fingerprint.clone(),
            response: response.encode_to_vec(),
            created_ms: now_ms,
        };
        Ok(w.put_replay(&self.workspace, &self.request_id, &rec)?)
    }
}
