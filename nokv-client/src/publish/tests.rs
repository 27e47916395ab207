//! The SDK's lease renewal during a publish, against an in-process fake `Workspace` server
//! (plain gRPC on loopback) whose handlers signal what they saw, so no test waits on time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use nokv_proto::block_checksum::BlockChecksums;
use nokv_proto::v1 as pb;
use pb::workspace_server::{Workspace, WorkspaceServer};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::sdk::Client;

/// The lease the fake grants: the SDK renews every third of it (100 ms).
const LEASE_MS: u64 = 300;

/// Fails a test that would otherwise hang. A deadlock detector, not a timing assertion.
async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("publish blocked")
}

#[derive(Clone)]
struct Fake {
    /// Renewals received.
    renewals: Arc<watch::Sender<u32>>,
    /// Refuse every renewal with `LeaseExpired`.
    refuse_renewals: bool,
    /// A PutBlock answers once this many renewals arrived (`None`: it never answers).
    put_after_renewals: Option<u32>,
    commits: Arc<AtomicU32>,
    aborts: Arc<AtomicU32>,
    /// Refuse every commit with this reason (as the server does when the declared sha256 is
    /// not that of the bytes it received: `DigestMismatch`).
    refuse_commit: Option<&'static str>,
    /// The sha256 each commit declared, and every block's declared checksums.
    declared: Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
    blocks: Arc<std::sync::Mutex<Vec<BlockChecksums>>>,
}

fn refusal(reason: &str) -> Status {
    let mut s = Status::failed_precondition(format!("{reason}: injected by the fake"));
    s.metadata_mut()
        .insert("nokv-reason", reason.parse().expect("ascii"));
    s
}

fn unused() -> Status {
    Status::unimplemented("not part of this fake")
}

#[tonic::async_trait]
impl Workspace for Fake {
    async fn route(
        &self,
        _: Request<pb::RouteRequest>,
    ) -> Result<Response<pb::RouteResponse>, Status> {
        Err(unused())
    }
    async fn stat(
        &self,
        _: Request<pb::StatRequest>,
    ) -> Result<Response<pb::StatResponse>, Status> {
        Err(unused())
    }
    async fn list(
        &self,
        _: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        Err(unused())
    }
    async fn read(
        &self,
        _: Request<pb::ReadRequest>,
    ) -> Result<Response<pb::ReadResponse>, Status> {
        Err(unused())
    }
    async fn write(
        &self,
        _: Request<pb::WriteRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        Err(unused())
    }
    async fn delete(
        &self,
        _: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        Err(unused())
    }
    async fn begin_upload(
        &self,
        req: Request<pb::BeginUploadRequest>,
    ) -> Result<Response<pb::BeginUploadResponse>, Status> {
        let req = req.into_inner();
        Ok(Response::new(pb::BeginUploadResponse {
            upload_id: "0.fake".into(),
            upload_token: "token".into(),
            block_size: 4,
            block_count: req.size.div_ceil(4) as u32,
            lease_expires_ms: 0,
            lease_ms: LEASE_MS,
            ..Default::default()
        }))
    }
    async fn put_block(
        &self,
        req: Request<pb::PutBlockRequest>,
    ) -> Result<Response<pb::PutBlockResponse>, Status> {
        let Some(n) = self.put_after_renewals else {
            return std::future::pending().await;
        };
        let mut seen = self.renewals.subscribe();
        let _ = seen.wait_for(|r| *r >= n).await;
        let req = req.into_inner();
        self.blocks.lock().unwrap().push(BlockChecksums::from(&req));
        Ok(Response::new(pb::PutBlockResponse {
            index: req.index,
            lease_expires_ms: 0,
        }))
    }
    async fn renew_upload(
        &self,
        _: Request<pb::RenewUploadRequest>,
    ) -> Result<Response<pb::RenewUploadResponse>, Status> {
        self.renewals.send_modify(|r| *r += 1);
        if self.refuse_renewals {
            return Err(refusal("LeaseExpired"));
        }
        Ok(Response::new(pb::RenewUploadResponse {
            lease_expires_ms: 0,
        }))
    }
    async fn commit_upload(
        &self,
        req: Request<pb::CommitUploadRequest>,
    ) -> Result<Response<pb::CommitUploadResponse>, Status> {
        self.commits.fetch_add(1, Ordering::SeqCst);
        self.declared.lock().unwrap().push(req.into_inner().sha256);
        if let Some(reason) = self.refuse_commit {
            return Err(refusal(reason));
        }
        Ok(Response::new(pb::CommitUploadResponse {
            entry: Some(pb::Entry::default()),
        }))
    }
    async fn abort_upload(
        &self,
        _: Request<pb::AbortUploadRequest>,
    ) -> Result<Response<pb::AbortUploadResponse>, Status> {
        self.aborts.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(pb::AbortUploadResponse {}))
    }
    async fn get_manifest(
        &self,
        _: Request<pb::GetManifestRequest>,
    ) -> Result<Response<pb::GetManifestResponse>, Status> {
        Err(unused())
    }
    type ReadBlockStream = futures::stream::Empty<Result<pb::ReadBlockChunk, Status>>;
    async fn read_block(
        &self,
        _: Request<pb::ReadBlockRequest>,
    ) -> Result<Response<Self::ReadBlockStream>, Status> {
        Err(unused())
    }
    async fn delete_workspace(
        &self,
        _: Request<pb::DeleteWorkspaceRequest>,
    ) -> Result<Response<pb::DeleteWorkspaceResponse>, Status> {
        Err(unused())
    }
    async fn edit(
        &self,
        _: Request<pb::EditRequest>,
    ) -> Result<Response<pb::EditResponse>, Status> {
        Err(unused())
    }
    async fn append(
        &self,
        _: Request<pb::AppendRequest>,
    ) -> Result<Response<pb::AppendResponse>, Status> {
        Err(unused())
    }
    async fn find(
        &self,
        _: Request<pb::FindRequest>,
    ) -> Result<Response<pb::FindResponse>, Status> {
        Err(unused())
    }
    type GrepStream = futures::stream::Empty<Result<pb::GrepChunk, Status>>;
    async fn grep(
        &self,
        _: Request<pb::GrepRequest>,
    ) -> Result<Response<Self::GrepStream>, Status> {
        Err(unused())
    }
}

impl Fake {
    fn new(refuse_renewals: bool, put_after_renewals: Option<u32>) -> Fake {
        Fake {
            renewals: Arc::new(watch::Sender::new(0)),
            refuse_renewals,
            put_after_renewals,
            commits: Arc::default(),
            aborts: Arc::default(),
            refuse_commit: None,
            declared: Arc::default(),
            blocks: Arc::default(),
        }
    }

    /// Serves this fake on a loopback port (until the test's runtime ends) and returns a
    /// client for it.
    fn serve(&self) -> Client {
        let incoming =
            tonic::transport::server::TcpIncoming::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = incoming.local_addr().unwrap();
        let svc = WorkspaceServer::new(self.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(incoming),
        );
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy();
        Client::from_channel(channel, None)
    }
}

/// Mutation caught: the renewal loop's `unary!(client, renew_upload, ..)` replaced by
/// `Ok::<_, ClientError>(())` (no renewal sent) → the block never completes (verified red).
#[tokio::test]
async fn the_sdk_renews_the_lease_while_blocks_are_in_flight() {
    // The block is answered only after two renewals arrived while it was in flight.
    let fake = Fake::new(false, Some(2));
    let client = fake.serve();
    let entry =
        within(client.publish_reader("ws", "art", &b"abcdefgh"[..], 8, Default::default())).await;
    assert!(entry.is_ok(), "{entry:?}");
    assert!(*fake.renewals.borrow() >= 2);
    assert_eq!(fake.commits.load(Ordering::SeqCst), 1);
}

/// Mutation caught: `publish_reader` awaiting `send_blocks` to the end before looking at
/// the renewal (the `tokio::select!` on `&mut renewal` removed) → the publish waits for a
/// block that never completes instead of stopping (verified red).
#[tokio::test]
async fn a_failed_renewal_stops_the_publish_with_its_reason_and_never_commits() {
    // Renewals are refused and the block never completes: only the renewal can end this.
    let fake = Fake::new(true, None);
    let client = fake.serve();
    let err = within(client.publish_reader("ws", "art", &b"abcdefgh"[..], 8, Default::default()))
        .await
        .unwrap_err();
    assert!(err.is("LeaseExpired"), "{err:?}");
    assert_eq!(fake.commits.load(Ordering::SeqCst), 0, "nothing committed");
    assert_eq!(
        fake.aborts.load(Ordering::SeqCst),
        1,
        "the upload was abandoned"
    );
}

/// A receipt publish: the file is hashed in a first pass (the receipt's identity) and the
/// commit declares that digest; every block goes with its CRC-32C and no sha256 of its own.
#[tokio::test]
async fn a_receipt_publish_commits_the_hashing_passs_digest_and_sends_crc32c_blocks() {
    use sha2::{Digest, Sha256};
    let fake = Fake::new(false, Some(0));
    let client = fake.serve();
    let file = source("receipt-digest");
    let opts = crate::publish::PublishOptions {
        receipt: Some("r1".into()),
        ..Default::default()
    };
    within(client.publish("ws", "art", &file, opts))
        .await
        .unwrap();
    assert_eq!(
        *fake.declared.lock().unwrap(),
        [Sha256::digest(b"abcdefgh").to_vec()]
    );
    let mut blocks = fake.blocks.lock().unwrap().clone();
    blocks.sort_by_key(|b| b.crc32c);
    let mut want = [BlockChecksums::of(b"abcd"), BlockChecksums::of(b"efgh")];
    want.sort_by_key(|b| b.crc32c);
    assert_eq!(blocks, want);
    let _ = std::fs::remove_file(file);
}

/// The server refusing a receipt's commit with `DigestMismatch` means the source changed
/// between the hashing and the sending pass: the client says so and ends the upload.
/// Mutation caught: the `DigestMismatch` arm removed → the server's reason comes through and
/// nothing is aborted (verified red).
#[tokio::test]
async fn a_source_that_changed_under_a_receipt_is_reported_and_its_upload_aborted() {
    let mut fake = Fake::new(false, Some(0));
    fake.refuse_commit = Some("DigestMismatch");
    let client = fake.serve();
    let file = source("receipt-changed");
    let opts = crate::publish::PublishOptions {
        receipt: Some("r1".into()),
        ..Default::default()
    };
    let err = within(client.publish("ws", "art", &file, opts))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("source changed"), "{err}");
    assert_eq!(
        fake.aborts.load(Ordering::SeqCst),
        1,
        "the upload was ended"
    );
    let _ = std::fs::remove_file(file);
}

/// A fresh 8-byte source file named after the test.
fn source(test: &str) -> std::path::PathBuf {
    let file = std::env::temp_dir().join(format!("nokv-publish-{test}-{}", std::process::id()));
    std::fs::write(&file, b"abcdefgh").unwrap();
    file
}
