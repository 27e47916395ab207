//! The route cache's epoch rule, and the SDK following `NotOwner` hints between in-process
//! fake `Workspace` servers (plain gRPC on loopback) that record what reached them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use nokv_proto::v1 as pb;
use pb::workspace_server::{Workspace, WorkspaceServer};
use tonic::{Request, Response, Status};

use super::*;
use crate::sdk::{Client, RetryPolicy};

#[test]
fn a_hint_older_than_the_cached_epoch_is_ignored_and_a_newer_one_is_followed() {
    let mut cache = RouteCache::default();
    assert!(cache.learn(Some("ws"), 3, "https://a:1", 5));
    assert!(!cache.learn(None, 3, "https://old:1", 4));
    assert_eq!(cache.route_of("ws").unwrap().endpoint, "https://a:1");
    assert!(cache.learn(None, 3, "https://b:1", 6));
    assert_eq!(
        cache.route_of("ws"),
        Some(&CachedRoute {
            endpoint: "https://b:1".into(),
            epoch: 6
        })
    );
}

#[test]
fn an_unreachable_owner_is_forgotten_but_its_epoch_still_refuses_older_hints() {
    let mut cache = RouteCache::default();
    cache.learn(Some("ws"), 1, "https://a:1", 2);
    cache.unreachable("https://a:1");
    assert_eq!(cache.route_of("ws").unwrap().endpoint, "");
    assert!(!cache.learn(None, 1, "https://old:1", 1));
    assert!(cache.learn(None, 1, "https://b:1", 2));
}

/// Fails a test that would otherwise hang. A deadlock detector, not a timing assertion.
async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("call blocked")
}

/// How a fake node answers writes.
#[derive(Clone)]
enum Answer {
    /// It owns the shard and accepts.
    Owner,
    /// `NotOwner` for shard 0 with this hint (endpoint set once the other fake listens).
    NotOwner {
        hint: Arc<Mutex<String>>,
        epoch: u64,
    },
}

#[derive(Clone)]
struct FakeNode {
    answer: Answer,
    /// Request ids of the writes that reached this node.
    writes: Arc<Mutex<Vec<String>>>,
}

fn not_owner(hint: &str, epoch: u64) -> Status {
    let mut s = Status::failed_precondition("NotOwner: shard 0 is not owned by this node");
    let md = s.metadata_mut();
    md.insert("nokv-reason", "NotOwner".parse().unwrap());
    md.insert(OWNER_HINT_KEY, hint.parse().unwrap());
    md.insert(OWNER_EPOCH_KEY, epoch.to_string().parse().unwrap());
    md.insert(OWNER_SHARD_KEY, "0".parse().unwrap());
    s
}

fn unused() -> Status {
    Status::unimplemented("not part of this fake")
}

#[tonic::async_trait]
impl Workspace for FakeNode {
    async fn write(
        &self,
        req: Request<pb::WriteRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        self.writes
            .lock()
            .unwrap()
            .push(req.get_ref().request_id.clone());
        match &self.answer {
            Answer::Owner => Ok(Response::new(pb::WriteResponse {
                entry: Some(pb::Entry::default()),
            })),
            Answer::NotOwner { hint, epoch } => Err(not_owner(&hint.lock().unwrap(), *epoch)),
        }
    }
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
    async fn delete(
        &self,
        _: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        Err(unused())
    }
    async fn begin_upload(
        &self,
        _: Request<pb::BeginUploadRequest>,
    ) -> Result<Response<pb::BeginUploadResponse>, Status> {
        Err(unused())
    }
    async fn put_block(
        &self,
        _: Request<pb::PutBlockRequest>,
    ) -> Result<Response<pb::PutBlockResponse>, Status> {
        Err(unused())
    }
    async fn renew_upload(
        &self,
        _: Request<pb::RenewUploadRequest>,
    ) -> Result<Response<pb::RenewUploadResponse>, Status> {
        Err(unused())
    }
    async fn commit_upload(
        &self,
        _: Request<pb::CommitUploadRequest>,
    ) -> Result<Response<pb::CommitUploadResponse>, Status> {
        Err(unused())
    }
    async fn abort_upload(
        &self,
        _: Request<pb::AbortUploadRequest>,
    ) -> Result<Response<pb::AbortUploadResponse>, Status> {
        Err(unused())
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

impl FakeNode {
    fn new(answer: Answer) -> FakeNode {
        FakeNode {
            answer,
            writes: Arc::default(),
        }
    }

    fn not_owner(epoch: u64) -> (FakeNode, Arc<Mutex<String>>) {
        let hint = Arc::new(Mutex::new(String::new()));
        let node = FakeNode::new(Answer::NotOwner {
            hint: hint.clone(),
            epoch,
        });
        (node, hint)
    }

    /// Serves this fake on a loopback port (until the test's runtime ends); its endpoint.
    fn serve(&self) -> String {
        let incoming =
            tonic::transport::server::TcpIncoming::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = incoming.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(WorkspaceServer::new(self.clone()))
                .serve_with_incoming(incoming),
        );
        format!("http://{addr}")
    }

    fn writes(&self) -> Vec<String> {
        self.writes.lock().unwrap().clone()
    }
}

fn client_of(endpoint: &str) -> Client {
    let channel = tonic::transport::Endpoint::from_shared(endpoint.to_string())
        .unwrap()
        .connect_lazy();
    Client::from_channel(channel, None)
}

fn write(id: &str) -> pb::WriteRequest {
    pb::WriteRequest {
        workspace: "ws".into(),
        path: "f".into(),
        data: b"x".to_vec().into(),
        request_id: id.into(),
        ..Default::default()
    }
}

/// Mutation caught: the `NotOwner` arm of `retrying_for` removed (the error returned as
/// is) → the write fails with NotOwner and B sees nothing (verified red).
#[tokio::test]
async fn a_not_owner_hint_is_followed_and_the_same_request_id_is_sent_to_the_owner() {
    let owner = FakeNode::new(Answer::Owner);
    let b = owner.serve();
    let (old, hint) = FakeNode::not_owner(1);
    *hint.lock().unwrap() = b.clone();
    let client = client_of(&old.serve());

    within(client.write(write("req-1"))).await.unwrap();

    assert_eq!(old.writes(), ["req-1"]);
    assert_eq!(
        owner.writes(),
        ["req-1"],
        "retried at the owner with the same id"
    );
    let cache = client.router().cache.lock().unwrap();
    assert_eq!(
        cache.route_of("ws"),
        Some(&CachedRoute {
            endpoint: b,
            epoch: 1
        }),
        "the hint is cached for the workspace"
    );
}

/// Mutation caught: `RouteCache::learn` accepting any epoch (its `c.epoch > epoch` check
/// removed) → the client follows the stale hint and writes through the old owner
/// (verified red).
#[tokio::test]
async fn a_hint_older_than_the_cached_route_is_never_followed_to_the_old_owner() {
    let old_owner = FakeNode::new(Answer::Owner);
    let old = old_owner.serve();
    // The cached owner (epoch 5) now answers NotOwner pointing back at epoch 4.
    let (cached, hint) = FakeNode::not_owner(4);
    *hint.lock().unwrap() = old.clone();
    let cached_endpoint = cached.serve();
    let client = client_of(&cached_endpoint);
    client
        .router()
        .cache
        .lock()
        .unwrap()
        .learn(Some("ws"), 0, &cached_endpoint, 5);

    let err = within(client.write(write("req-2"))).await.unwrap_err();

    assert!(err.is("NotOwner"), "{err:?}");
    assert!(
        old_owner.writes().is_empty(),
        "nothing sent to the old owner"
    );
}

/// Mutation caught: the `hops <= MAX_HOPS` bound removed → two nodes hinting at each other
/// keep the call bouncing forever (the test's deadlock detector fires; verified red).
#[tokio::test]
async fn hints_that_bounce_between_nodes_end_in_a_clear_not_owner_error() {
    let (a, hint_a) = FakeNode::not_owner(2);
    let (b, hint_b) = FakeNode::not_owner(2);
    let (ea, eb) = (a.serve(), b.serve());
    *hint_a.lock().unwrap() = eb;
    *hint_b.lock().unwrap() = ea.clone();
    let client = client_of(&ea);

    let err = within(client.write(write("req-3"))).await.unwrap_err();

    assert!(err.is("NotOwner"), "{err:?}");
    assert!(err.message.contains("no usable owner hint"), "{err}");
    assert_eq!(
        a.writes().len() + b.writes().len(),
        MAX_HOPS as usize + 1,
        "bounded"
    );
}

/// Mutation caught: forgetting an unreachable endpoint only when another attempt follows →
/// with one attempt per call, every later call goes back to the dead endpoint (found by the
/// failover benchmark: its write loop never reached the new owner).
#[tokio::test]
async fn with_one_attempt_per_call_the_next_call_skips_an_endpoint_that_did_not_answer() {
    let live = FakeNode::new(Answer::Owner);
    let live_endpoint = live.serve();
    // Nothing listens here: bound, then dropped.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let client = Client::plain(vec![dead, live_endpoint]).with_retry(RetryPolicy {
        attempts: 1,
        first_backoff: std::time::Duration::from_millis(1),
        max_backoff: std::time::Duration::from_millis(1),
    });
    assert!(within(client.write(write("req-1"))).await.is_err());
    within(client.write(write("req-2"))).await.unwrap();
    assert_eq!(live.writes(), ["req-2"]);
}

/// Mutation caught: the fail-fast arm for a refused connection removed → the first call is
/// attempted eight times (with backoff) before it fails.
#[tokio::test]
async fn a_refused_connection_is_not_retried_until_a_server_has_answered() {
    use std::sync::atomic::{AtomicU32, Ordering};
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let attempts = AtomicU32::new(0);
    let stat = |conn: Conn| {
        attempts.fetch_add(1, Ordering::Relaxed);
        let mut c = conn.ws;
        async move { c.stat(pb::StatRequest::default()).await }
    };
    let client = Client::plain(vec![dead.clone()]).with_retry(RetryPolicy {
        attempts: 3,
        first_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(1),
    });
    let err = within(client.retrying("stat", stat)).await.unwrap_err();
    assert_eq!(attempts.load(Ordering::Relaxed), 1, "{err}");
    assert_eq!(err.reason, crate::Reason::Refused, "{err:?}");
    assert!(!err.outcome_unknown());
    assert_eq!(
        err.message,
        format!("cannot connect to {dead} (connection refused): is nokv-server running?")
    );

    // Once a server has answered, a refusal is a restart: retried like any transient failure.
    client.router().answered();
    attempts.store(0, Ordering::Relaxed);
    let err = within(client.retrying("stat", stat)).await.unwrap_err();
    assert_eq!(attempts.load(Ordering::Relaxed), 3, "{err}");
}
