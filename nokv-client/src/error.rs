//! Client-side errors: the server's machine-readable reason (from the `nokv-reason`
//! metadata of a status), or a local failure.

use tonic::{Code, Status};

/// The reason a call failed, as the server names it, plus local reasons of the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// A server reason such as `NotFound`, `GenerationMismatch` or `DataCorrupted` (stored
    /// bytes failed their recorded digest; not retryable).
    Server(String),
    /// The client could not reach or speak to the server, and a request may have been sent:
    /// the outcome of a mutation is unknown.
    Transport,
    /// The connection was refused (nothing listens at the endpoint): no request was sent, so
    /// the outcome is known — nothing was applied. Its name is still `Transport` (scripts and
    /// hosts match that name); the variant lets the retry loop fail fast and hints be exact.
    Refused,
    /// Local configuration or I/O.
    Local,
    /// Downloaded bytes do not match their recorded digest.
    Integrity,
    /// The command line asks for something that cannot be done as stated (the CLI exits 2).
    Usage,
    /// The server's certificate is not signed by the configured CA: retrying cannot help.
    Untrusted,
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

    pub fn usage(message: impl Into<String>) -> Self {
        ClientError {
            reason: Reason::Usage,
            code: None,
            message: message.into(),
        }
    }

    /// The reason's name: a server reason, or one of the client's own (`Transport`, `Local`,
    /// `DigestMismatch`, `Usage`, `CertificateNotTrusted`).
    pub fn reason_name(&self) -> &str {
        match &self.reason {
            Reason::Server(r) => r,
            Reason::Transport | Reason::Refused => "Transport",
            Reason::Local => "Local",
            Reason::Integrity => "DigestMismatch",
            Reason::Usage => "Usage",
            Reason::Untrusted => "CertificateNotTrusted",
        }
    }

    /// The outcome of a mutation that failed this way is unknown: the request may have been
    /// applied before the answer was lost. Only resending it with the same request id is safe.
    pub fn outcome_unknown(&self) -> bool {
        self.reason == Reason::Transport || self.is("Unavailable")
    }

    /// For a mutation sent with `request_id`: when its outcome is unknown, says so and how to
    /// retry it without applying it twice (the server replays the recorded outcome of a
    /// request id it has seen).
    pub fn with_retry_hint(mut self, request_id: &str) -> Self {
        if self.outcome_unknown() {
            self.message = format!(
                "{}; the outcome is unknown (the request may have been applied): retry the same \
                 command with --request-id {request_id} to apply it at most once",
                self.message
            );
        }
        self
    }

    pub fn is(&self, reason: &str) -> bool {
        self.reason_name() == reason
    }

    /// The call failed below the server: no answer ([`Reason::Transport`]) or no connection
    /// at all ([`Reason::Refused`]).
    pub fn is_transport(&self) -> bool {
        matches!(self.reason, Reason::Transport | Reason::Refused)
    }

    /// Retryable with the same request id: the server was unavailable, or the outcome is
    /// unknown because the call never got an answer, or the server's block-memory budget was
    /// in use (`ResourceExhausted`: nothing was done; unlike `QuotaExceeded`, which shares the
    /// gRPC code but is not transient).
    pub fn is_retryable(&self) -> bool {
        if matches!(&self.reason, Reason::Server(r) if r == "ResourceExhausted") {
            return true;
        }
        let transient = matches!(
            self.code,
            Some(Code::Unavailable) | Some(Code::DeadlineExceeded) | Some(Code::Cancelled)
        ) || (self.code == Some(Code::Unknown) && self.is_transport());
        transient && !matches!(&self.reason, Reason::Server(r) if r != "Unavailable")
    }
}

/// The TLS failure in an error's source chain when the server's certificate was rejected (not
/// signed by the configured CA, or not valid for the endpoint's name), else `None`.
fn untrusted_certificate(mut e: Option<&(dyn std::error::Error + 'static)>) -> Option<String> {
    while let Some(err) = e {
        let tls = err.downcast_ref::<rustls::Error>().or_else(|| {
            err.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(rustls::Error::InvalidCertificate(why)) = tls {
            return Some(format!("{why:?}"));
        }
        e = err.source();
    }
    None
}

fn untrusted(why: String) -> ClientError {
    ClientError {
        reason: Reason::Untrusted,
        code: None,
        message: format!(
            "certificate not trusted: the server's certificate does not verify against the \
             configured CA ({why}); check --ca / NOKV_CA / the ca of NOKV_CONFIG"
        ),
    }
}

/// The I/O failure of connecting, in an error's source chain (the TCP and TLS connect of a lazily
/// connected channel), else `None`.
fn connect_failure<'a>(
    mut e: Option<&'a (dyn std::error::Error + 'static)>,
) -> Option<&'a std::io::Error> {
    while let Some(err) = e {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return Some(io);
        }
        e = err.source();
    }
    None
}

/// A refused connection. The endpoint is not known here: the retry loop, which knows it,
/// names it ([`crate::sdk::Client::retrying_for`]).
pub(crate) fn refused(endpoint: &str) -> ClientError {
    ClientError {
        reason: Reason::Refused,
        code: Some(Code::Unavailable),
        message: format!(
            "cannot connect to {endpoint} (connection refused): is nokv-server running?"
        ),
    }
}

impl From<Status> for ClientError {
    fn from(s: Status) -> Self {
        if let Some(why) = untrusted_certificate(std::error::Error::source(&s)) {
            return untrusted(why);
        }
        if s.metadata().get("nokv-reason").is_none()
            && let Some(io) = connect_failure(std::error::Error::source(&s))
        {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return refused("the endpoint");
            }
            if io.kind() == std::io::ErrorKind::TimedOut {
                // The connect timeout covers TCP and TLS: a peer that accepted the connection
                // and never answered (a stopped process, a partition) ends here too.
                return ClientError {
                    reason: Reason::Transport,
                    code: Some(s.code()),
                    message: format!(
                        "no answer while connecting ({io}): the server is stopped, overloaded \
                         or unreachable"
                    ),
                };
            }
            // Other connect failures (no route, reset) keep their cause in the text.
            return ClientError {
                reason: Reason::Transport,
                code: Some(s.code()),
                message: format!("{:?}: {}: {io}", s.code(), s.message()),
            };
        }
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
        if let Some(why) = untrusted_certificate(Some(&e)) {
            return untrusted(why);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: Code, reason: &str) -> Status {
        let mut s = Status::new(code, format!("{reason}: x"));
        s.metadata_mut()
            .insert("nokv-reason", reason.parse().expect("ascii"));
        s
    }

    #[test]
    fn a_server_out_of_block_memory_is_retried_but_an_exceeded_quota_is_not() {
        let busy = ClientError::from(status(Code::ResourceExhausted, "ResourceExhausted"));
        assert!(busy.is("ResourceExhausted"));
        assert!(busy.is_retryable());
        let quota = ClientError::from(status(Code::ResourceExhausted, "QuotaExceeded"));
        assert!(!quota.is_retryable());
    }
}
