//! Is a peer node up? One TCP connect to its advertised endpoint, bounded in time.
//!
//! A node's registration in etcd outlives the process by up to a lease TTL: a node killed a
//! moment ago is still listed as a live member. Operations addressed to one peer (`nokv admin
//! shard move S NODE`, or to the owner of a shard) ask this first, so an operator learns at
//! once that the peer is down instead of after a handoff that nobody completes. A refused or
//! timed-out connect is a strong signal (the port is closed, or the host is gone); an accepted
//! one proves little more than that the process holds its socket, which is all it claims.

use std::time::Duration;

/// How long a connect may take before the peer counts as down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// `Ok` if something accepts TCP connections at `endpoint` (`https://host:port`); otherwise
/// why not, in words fit for an operator.
pub async fn reachable(endpoint: &str) -> Result<(), String> {
    let authority = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest)
        .trim_end_matches('/');
    match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(authority)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("{endpoint} refused the connection ({e})")),
        Err(_) => Err(format!(
            "{endpoint} did not accept a connection within {CONNECT_TIMEOUT:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_listening_endpoint_is_reachable_and_a_closed_port_is_not() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open = format!("https://{}", listener.local_addr().unwrap());
        assert_eq!(reachable(&open).await, Ok(()));
        drop(listener);
        let err = reachable(&open).await.unwrap_err();
        assert!(err.contains("refused"), "{err}");
    }
}
