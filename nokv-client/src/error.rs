//! Client-side errors: the server's machine-readable reason (from the `nokv-reason`
//! metadata of a status), or a local failure.

use tonic::{Code, Status};

/// The reason a call failed, as the server names it, plus local reasons of the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// A server reason such as `NotFound`, `GenerationMismatch` or `DataCorrupted` (stored
    /// bytes failed their recorded digest; not retryable).
    Server(String),
    /// The client could not reach or speak to the server.
    Transport,
    /// Local configuration or I/O.
    Local,
    /// Downloaded bytes do not match their recorded digest.
    Integrity,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ClientError {
    pub reason: Reason,
    pub code: Option<Code>,
    pub message: String,
}

impl ClientError {
    pub fn local(message: impl Into<String>) -> Self {
        ClientError {
            reason: Reason::Local,
            code: None,
            message: message.into(),
        }
    }

    pub fn integrity(message: impl Into<String>) -> Self {
        ClientError {
            reason: Reason::Integrity,
            code: None,
            message: message.into(),
        }
    }

    /// The reason's name: a server reason, `Transport` or `Local`.
    pub fn reason_name(&self) -> &str {
        match &self.reason {
            Reason::Server(r) => r,
            Reason::Transport => "Transport",
            Reason::Local => "Local",
            Reason::Integrity => "DigestMismatch",
        }
    }

    pub fn is(&self, reason: &str) -> bool {
        self.reason_name() == reason
    }

    /// Retryable with the same request id: the server was unavailable, or the outcome is
    /// unknown because the call never got an answer.
    pub fn is_retryable(&self) -> bool {
        let transient = matches!(
            self.code,
            Some(Code::Unavailable) | Some(Code::DeadlineExceeded) | Some(Code::Cancelled)
        ) || (self.code == Some(Code::Unknown) && self.reason == Reason::Transport);
        transient && !matches!(&self.reason, Reason::Server(r) if r != "Unavailable")
    }
}

impl From<Status> for ClientError {
    fn from(s: Status) -> Self {
        let reason = s
            .metadata()
            .get("nokv-reason")
            .and_then(|v| v.to_str().ok())
            .map(|r| Reason::Server(r.to_string()));
        let (reason, message) = match reason {
            Some(r) => (r, s.message().to_string()),
            // No reason: the status came from the transport or the gRPC stack itself.
            None => {
                let name = match s.code() {
                    Code::Unauthenticated => Reason::Server("Unauthenticated".into()),
                    Code::PermissionDenied => Reason::Server("PermissionDenied".into()),
                    Code::InvalidArgument => Reason::Server("InvalidArgument".into()),
                    Code::Unimplemented => Reason::Server("Unimplemented".into()),
                    Code::ResourceExhausted => Reason::Server("ResourceExhausted".into()),
                    // The server refused to return bytes that fail their recorded digest.
                    Code::DataLoss => Reason::Server("DataCorrupted".into()),
                    _ => Reason::Transport,
                };
                let msg = format!("{:?}: {}", s.code(), s.message());
                (name, msg)
            }
        };
        ClientError {
            reason,
            code: Some(s.code()),
            message,
        }
    }
}

impl From<tonic::transport::Error> for ClientError {
    fn from(e: tonic::transport::Error) -> Self {
        let mut msg = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg.push_str(": ");
            msg.push_str(&s.to_string());
            src = s.source();
        }
        ClientError {
            reason: Reason::Transport,
            code: Some(Code::Unavailable),
            message: msg,
        }
    }
}
