//! A fault-injecting object store — a fake for tests, named as such. It wraps a real store
//! (usually in-memory) and can hold every create until released, lose the response of a
//! create that did land, or fail a create before sending it; it can also fail the next
//! deletes and reads (nothing reaches the inner store then). It counts creates and deletes
//! that reached the inner store so tests can prove "the provider received no write" or "the
//! key was deleted once".

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    ObjectStoreExt, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use tokio::sync::{Notify, Semaphore};

/// Shared switches of a [`FaultyStore`]; clone freely.
#[derive(Clone, Default)]
pub struct Faults {
    inner: Arc<FaultState>,
}

struct FaultState {
    hold: AtomicBool,
    release: Semaphore,
    arrived: Notify,
    held_now: AtomicUsize,
    creates: AtomicUsize,
    lose_next_response: AtomicBool,
    refuse_next: AtomicBool,
    /// Deletes still to fail before they reach the inner store.
    failing_deletes: AtomicUsize,
    deletes: AtomicUsize,
    /// Reads still to fail before they reach the inner store.
    failing_reads: AtomicUsize,
    /// Deletes of keys containing this text fail, every time (a permanent outage for them).
    failing_keys: parking_lot::Mutex<Option<String>>,
}

impl Default for FaultState {
    fn default() -> Self {
        FaultState {
            hold: AtomicBool::new(false),
            release: Semaphore::new(0),
            arrived: Notify::new(),
            held_now: AtomicUsize::new(0),
            creates: AtomicUsize::new(0),
            lose_next_response: AtomicBool::new(false),
            refuse_next: AtomicBool::new(false),
            failing_deletes: AtomicUsize::new(0),
            deletes: AtomicUsize::new(0),
            failing_reads: AtomicUsize::new(0),
            failing_keys: parking_lot::Mutex::new(None),
        }
    }
}

impl Faults {
    /// From now on every create waits until [`Faults::release`] lets it through.
    pub fn hold_creates(&self) {
        self.inner.hold.store(true, Ordering::SeqCst);
    }

    /// Lets `n` held creates proceed and stops holding new ones.
    pub fn release(&self, n: usize) {
        self.inner.hold.store(false, Ordering::SeqCst);
        self.inner.release.add_permits(n);
    }

    /// Waits until at least `n` creates are being held.
    pub async fn wait_held(&self, n: usize) {
        loop {
            let notified = self.inner.arrived.notified();
            if self.inner.held_now.load(Ordering::SeqCst) >= n {
                return;
            }
            notified.await;
        }
    }

    /// Creates that reached the inner store.
    pub fn creates(&self) -> usize {
        self.inner.creates.load(Ordering::SeqCst)
    }

    /// The next create lands but its caller gets an error (an unknown outcome).
    pub fn lose_next_response(&self) {
        self.inner.lose_next_response.store(true, Ordering::SeqCst);
    }

    /// The next create fails as if the connection was refused (nothing sent).
    pub fn refuse_next(&self) {
        self.inner.refuse_next.store(true, Ordering::SeqCst);
    }

    /// The next `n` deletes fail as if the connection was refused (nothing deleted).
    pub fn fail_next_deletes(&self, n: usize) {
        self.inner.failing_deletes.store(n, Ordering::SeqCst);
    }

    /// From now on every delete of a key containing `text` fails (nothing deleted).
    pub fn fail_deletes_of_keys_containing(&self, text: &str) {
        *self.inner.failing_keys.lock() = Some(text.to_string());
    }

    /// Deletes that reached the inner store.
    pub fn deletes(&self) -> usize {
        self.inner.deletes.load(Ordering::SeqCst)
    }

    /// The next `n` reads (GET, HEAD, ranges) fail as if the connection was refused.
    pub fn fail_next_reads(&self, n: usize) {
        self.inner.failing_reads.store(n, Ordering::SeqCst);
    }
}

/// Takes one injected failure from `counter` if any is left.
fn take_one(counter: &AtomicUsize) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    faults: Faults,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn ObjectStore>, faults: Faults) -> FaultyStore {
        FaultyStore { inner, faults }
    }
}

impl fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

fn refused() -> object_store::Error {
    object_store::Error::Generic {
        store: "faulty",
        source: Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
    }
}

#[async_trait::async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let s = &self.faults.inner;
        if s.hold.load(Ordering::SeqCst) {
            s.held_now.fetch_add(1, Ordering::SeqCst);
            s.arrived.notify_waiters();
            let permit = s.release.acquire().await.expect("semaphore open");
            permit.forget();
            s.held_now.fetch_sub(1, Ordering::SeqCst);
        }
        if s.refuse_next.swap(false, Ordering::SeqCst) {
            return Err(refused());
        }
        s.creates.fetch_add(1, Ordering::SeqCst);
        let r = self.inner.put_opts(location, payload, opts).await?;
        if s.lose_next_response.swap(false, Ordering::SeqCst) {
            return Err(object_store::Error::Generic {
                store: "faulty",
                source: "injected: response lost after the write landed".into(),
            });
        }
        Ok(r)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        if take_one(&self.faults.inner.failing_reads) {
            return Err(refused());
        }
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let (inner, faults) = (self.inner.clone(), self.faults.clone());
        locations
            .then(move |location| {
                let (inner, faults) = (inner.clone(), faults.clone());
                async move {
                    let location = location?;
                    let s = &faults.inner;
                    let doomed = s
                        .failing_keys
                        .lock()
                        .as_deref()
                        .is_some_and(|t| location.as_ref().contains(t));
                    if doomed || take_one(&s.failing_deletes) {
                        return Err(refused());
                    }
                    s.deletes.fetch_add(1, Ordering::SeqCst);
                    inner.delete(&location).await?;
                    Ok(location)
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}
