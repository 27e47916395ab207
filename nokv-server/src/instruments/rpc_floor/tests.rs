use std::path::PathBuf;

use nokv_proto::v1::workspace_client::WorkspaceClient;
use tokio::sync::oneshot;
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use super::*;
use crate::token::Claims;

/// An `rpc-floor` serving on loopback from a fresh data dir, stopped when dropped.
struct Running {
    _dir: tempfile::TempDir,
    scratch: PathBuf,
    signer: Signer,
    channel: Channel,
    _stop: oneshot::Sender<()>,
}

async fn start(durable: Durable) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let material = bootstrap::ensure(&data, None).unwrap();
    let scratch = dir.path().join("scratch");
    let listener = crate::server::bind("127.0.0.1:0").await.unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let (ready, endpoint) = oneshot::channel::<String>();
    let s = scratch.clone();
    tokio::spawn(async move {
        // The same material, read back from the data dir as `run` does.
        let m = bootstrap::load_existing(&data).unwrap();
        serve(
            &m,
            &s,
            listener,
            durable,
            |e| {
                let _ = ready.send(e.to_string());
            },
            async {
                let _ = stopped.await;
            },
        )
        .await
        .unwrap()
    });
    let endpoint = endpoint.await.unwrap();
    let ca = std::fs::read(&material.ca_path).unwrap();
    let channel = Endpoint::from_shared(endpoint)
        .unwrap()
        .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)))
        .unwrap()
        .connect()
        .await
        .unwrap();
    Running {
        _dir: dir,
        scratch,
        signer: material.signer.clone(),
        channel,
        _stop: stop,
    }
}

impl Running {
    fn token(&self, workspace: &str, role: Role) -> String {
        self.signer.issue(&Claims {
            workspaces: vec![workspace.into()],
            role,
            expires: u64::MAX / 2,
        })
    }

    async fn write(
        &self,
        token: Option<&str>,
        path: &str,
        request_id: &str,
        data: &[u8],
    ) -> std::result::Result<pb::WriteResponse, Status> {
        let mut req = Request::new(pb::WriteRequest {
            workspace: "ws".into(),
            path: path.into(),
            request_id: request_id.into(),
            data: data.to_vec().into(),
            ..Default::default()
        });
        if let Some(t) = token {
            req.metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        WorkspaceClient::new(self.channel.clone())
            .write(req)
            .await
            .map(Response::into_inner)
    }

    fn scratch(&self) -> Vec<u8> {
        std::fs::read(&self.scratch).unwrap()
    }
}

#[tokio::test]
async fn a_write_is_answered_once_its_body_is_in_the_scratch_file_whichever_thread_writes_it() {
    for durable in [Durable::Writer, Durable::Inline] {
        let floor = start(durable).await;
        let token = floor.token("ws", Role::Write);
        let first = floor
            .write(Some(&token), "a/b.txt", "r1", &[7u8; 4096])
            .await
            .unwrap();
        let entry = first.entry.unwrap();
        assert_eq!((entry.path.as_str(), entry.size), ("a/b.txt", 4096));
        floor
            .write(Some(&token), "c.txt", "r2", b"second")
            .await
            .unwrap();
        let bytes = floor.scratch();
        assert_eq!(bytes.len() as u64, SCRATCH_BYTES, "{durable:?}");
        assert!(bytes[..4096].iter().all(|&b| b == 7), "{durable:?}");
        // Each body starts at the next 4 KiB boundary.
        assert_eq!(&bytes[4096..4102], b"second", "{durable:?}");
    }
}

#[tokio::test]
async fn a_write_the_daemon_would_refuse_is_refused_the_same_way_and_writes_nothing() {
    let floor = start(Durable::Writer).await;
    let body = [9u8; 4096];
    let write = floor.token("ws", Role::Write);
    let refusals = [
        (None, "ok.txt", "r1", Code::Unauthenticated),
        (
            Some(floor.token("other", Role::Write)),
            "ok.txt",
            "r1",
            Code::PermissionDenied,
        ),
        (
            Some(floor.token("ws", Role::Read)),
            "ok.txt",
            "r1",
            Code::PermissionDenied,
        ),
        (
            Some(write.clone()),
            "../outside",
            "r1",
            Code::InvalidArgument,
        ),
        (Some(write), "ok.txt", "", Code::InvalidArgument),
    ];
    for (token, path, id, code) in refusals {
        let e = floor
            .write(token.as_deref(), path, id, &body)
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "{path}: {e:?}");
    }
    assert!(
        floor.scratch().iter().all(|&b| b == 0),
        "a refused write reached the file"
    );
}

#[tokio::test]
async fn every_other_method_is_unimplemented() {
    let floor = start(Durable::Writer).await;
    let e = WorkspaceClient::new(floor.channel.clone())
        .stat(pb::StatRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
}
