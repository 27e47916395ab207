//! Request-id replay: the outcome of every mutation is recorded under (workspace, request id)
//! together with the request's fingerprint, inside the same write session as the mutation.
//! A retry with the same id and fingerprint gets the recorded outcome — the response, or the
//! refusal (AlreadyExists, NotFound, GenerationMismatch, MatchCount) the state gave at the
//! time — and changes nothing; the same id with another fingerprint is refused.

use prost::Message;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::meta::{ReplayRecord, WriteView};

thread_local! {
    /// The request being fingerprinted, encoded: one buffer per thread instead of an
    /// allocation (and a small file's body copied into it) per mutation.
    static ENCODED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// What [`ENCODED`] keeps between requests: enough for a small file, not a rare large one.
const ENCODED_KEPT: usize = 64 * 1024;

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
        ENCODED.with_borrow_mut(|buf| {
            buf.clear();
            request
                .encode(buf)
                .expect("a Vec grows to any encoded length");
            h.update(&buf[..]);
            // Emptied first: `shrink_to` never goes below the length.
            buf.clear();
            buf.shrink_to(ENCODED_KEPT);
        });
        RequestKey {
            workspace: workspace.to_string(),
            request_id: request_id.to_string(),
            fingerprint: h.finalize().to_vec(),
        }
    }

    /// The recorded outcome of this request, if any: `Some(Ok(response))` or
    /// `Some(Err(refusal))`. A different request under the same id is `RequestIdReused`.
    pub fn recorded<R: Message + Default>(&self, w: &WriteView) -> Result<Option<Result<R>>> {
        let Some(rec) = w.replay(&self.workspace, &self.request_id)? else {
            return Ok(None);
        };
        if rec.fingerprint != self.fingerprint {
            return Err(Error::RequestIdReused(format!(
                "request id {:?} was already used for a different request",
                self.request_id
            )));
        }
        if !rec.refusal.is_empty() {
            return Ok(Some(Err(refusal_from_record(&rec))));
        }
        R::decode(rec.response.as_slice())
            .map(|r| Some(Ok(r)))
            .map_err(|e| Error::Internal(format!("recorded outcome is corrupt: {e}")))
    }

    /// Runs one small-file mutation with replay. `check` reads the state and may refuse the
    /// request; a refusal is recorded (so a retry sees the same answer even after the state
    /// changed) and returned as the inner error, with the session still committing the
    /// record. Only when `check` passes does `apply` write. Storage failures are the outer
    /// error and abort the session. `now` is the shard clock, read inside the session.
    pub fn execute<S, R: Message + Default>(
        &self,
        w: &mut WriteView,
        now: i64,
        check: impl FnOnce(&WriteView) -> Result<S>,
        apply: impl FnOnce(&mut WriteView, S, i64) -> Result<R>,
    ) -> Result<Result<R>> {
        if let Some(outcome) = self.recorded(w)? {
            return Ok(outcome);
        }
        match check(w) {
            Ok(state) => {
                let resp = apply(w, state, now)?;
                self.record(w, &resp, now)?;
                Ok(Ok(resp))
            }
            Err(e) => match refusal_record(&e) {
                Some(mut rec) => {
                    rec.fingerprint = self.fingerprint.clone();
                    rec.created_ms = now;
                    w.put_replay(&self.workspace, &self.request_id, &rec)?;
                    Ok(Err(e))
                }
                None => Err(e),
            },
        }
    }

    pub fn record<R: Message>(&self, w: &mut WriteView, response: &R, now_ms: i64) -> Result<()> {
        let rec = ReplayRecord {
            fingerprint: self.fingerprint.clone(),
            response: response.encode_to_vec(),
            created_ms: now_ms,
            ..Default::default()
        };
        Ok(w.put_replay(&self.workspace, &self.request_id, &rec)?)
    }
}

/// The refusals that are outcomes of the state (and so are replayed), as records.
fn refusal_record(e: &Error) -> Option<ReplayRecord> {
    let mut rec = ReplayRecord {
        refusal: e.reason().to_string(),
        refusal_message: e.to_string(),
        ..Default::default()
    };
    match e {
        Error::GenerationMismatch { expected, current } => {
            (rec.expected, rec.current) = (*expected, *current);
        }
        Error::MatchCount { count, what } => {
            (rec.match_count, rec.match_subject) = (*count, what.clone());
        }
        Error::AlreadyExists(_) | Error::NotFound(_) => {}
        _ => return None,
    }
    Some(rec)
}

fn refusal_from_record(rec: &ReplayRecord) -> Error {
    let msg = rec.refusal_message.clone();
    match rec.refusal.as_str() {
        "AlreadyExists" => Error::AlreadyExists(msg),
        "NotFound" => Error::NotFound(msg),
        "GenerationMismatch" => Error::GenerationMismatch {
            expected: rec.expected,
            current: rec.current,
        },
        "MatchCount" => Error::MatchCount {
            count: rec.match_count,
            what: rec.match_subject.clone(),
        },
        other => Error::Internal(format!("recorded refusal {other:?} is unknown")),
    }
}

#[cfg(test)]
mod tests;
