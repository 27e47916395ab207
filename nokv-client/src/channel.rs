//! The connection pieces of the client: the bearer-token interceptor, the service type it
//! wraps a channel in, and TLS channels to `https://` endpoints trusting only the configured
//! CA. Below both [`crate::route`] (which opens a channel per endpoint it learns of) and
//! [`crate::sdk`] (which builds the first one and retries over the router), so neither needs
//! the other to connect.

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use nokv_proto::MAX_MESSAGE;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Request, Status};

use crate::config::{ResolvedConfig, require_https};
use crate::error::ClientError;

type Result<T> = std::result::Result<T, ClientError>;

/// Adds the bearer token to every call. The token is held only here and never printed.
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<tonic::metadata::Ascii>>);

impl Interceptor for Bearer {
    fn call(&mut self, mut req: Request<()>) -> std::result::Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

pub type Svc = InterceptedService<Channel, Bearer>;

pub(crate) fn bearer(token: Option<&str>) -> Bearer {
    Bearer(token.and_then(|t| format!("Bearer {}", t.trim()).parse().ok()))
}

pub(crate) fn read_ca(cfg: &ResolvedConfig) -> Result<Certificate> {
    let ca = std::fs::read(&cfg.ca)
        .map_err(|e| ClientError::local(format!("CA file {}: {e}", cfg.ca.display())))?;
    Ok(Certificate::from_pem(ca))
}

/// A TLS channel to the (first) configured endpoint, trusting only the configured CA. The
/// connection is made lazily, so a server that is briefly down is covered by the retry policy
/// (except a refused first connection: see [`crate::sdk::Client::retrying_for`]).
pub fn channel(cfg: &ResolvedConfig) -> Result<Channel> {
    tls_channel(&cfg.endpoints()[0], read_ca(cfg)?)
}

/// Connecting, TCP and TLS together.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often an open call's connection is pinged.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// How long a ping may go unanswered before the connection is given up.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// A lazily connected TLS channel to `endpoint`, trusting only `ca`.
pub fn tls_channel(endpoint: &str, ca: Certificate) -> Result<Channel> {
    require_https(endpoint)?;
    let endpoint = Endpoint::from_shared(endpoint.to_string())
        .map_err(|e| ClientError::local(format!("endpoint {endpoint:?}: {e}")))?
        .tls_config(ClientTlsConfig::new().ca_certificate(ca))?;
    // The connector is given explicitly so that tonic bounds all of connecting by the connect
    // timeout, the TLS handshake included: with its own connector it bounds the TCP connect
    // alone, and a server process that is stopped (or a peer that accepts and answers nothing)
    // completes the TCP handshake in the kernel, then hangs the TLS one forever.
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    let channel = endpoint
        .connect_timeout(CONNECT_TIMEOUT)
        // A server that answers nothing (a stopped process, a partition) must fail the call,
        // not hang it: while a call is open the connection is pinged, and one left unanswered
        // for KEEPALIVE_TIMEOUT ends the connection — the call then fails as a transport error
        // and is retried like any other (same request id, so a write applies once). A slow
        // call on a live server is never cut short: its runtime answers pings meanwhile.
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(false)
        // Room for whole blocks in flight instead of HTTP/2's 64 KiB default window.
        .initial_stream_window_size(MAX_MESSAGE as u32)
        .initial_connection_window_size(4 * MAX_MESSAGE as u32)
        .connect_with_connector_lazy(tcp);
    Ok(channel)
}
