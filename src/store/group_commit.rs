//! Group commit, the loop shared by the store's writer tasks (reported runs, the cluster
//! occupancy). Callers queue a request on a bounded queue and wait for its answer; one
//! writer task takes the first queued request, lets its [`Committer`] write it with
//! whatever else is queued by then in one transaction, and goes on to the next. Each
//! caller is answered only once its batch has committed (or failed), so an acknowledged
//! write is durable. Nothing waits on a timer: a lone request is written at once.
//!
//! At `stop` the queue refuses new requests, the ones already queued are still written,
//! and `stop` returns once the writer has finished.

use std::future::Future;

use tokio::{
    sync::{mpsc, oneshot},
    task::JoinHandle,
};
use tokio_util::sync::CancellationToken;

use super::StoreError;

/// What one writer commits: a batch of its requests, in one transaction.
pub(super) trait Committer: Send + 'static {
    /// One queued write, with the sender its caller waits on.
    type Request: Send + 'static;

    /// Writes `first` and the requests queued behind it (taken with [`take_queued`], up
    /// to the committer's batch size) in one transaction, and answers every caller.
    fn commit(
        &mut self,
        first: Self::Request,
        queue: &mut mpsc::Receiver<Self::Request>,
    ) -> impl Future<Output = ()> + Send;
}

/// Moves what is queued now into `batch`, until it holds `max` requests.
pub(super) fn take_queued<R>(batch: &mut Vec<R>, queue: &mut mpsc::Receiver<R>, max: usize) {
    while batch.len() < max {
        match queue.try_recv() {
            Ok(request) => batch.push(request),
            Err(_) => break,
        }
    }
}

/// The handle a store keeps on one writer task: its queue and the task.
#[derive(Debug)]
pub(super) struct GroupCommit<R> {
    /// The task's name in the log.
    name: &'static str,
    request_tx: mpsc::Sender<R>,
    shutdown: CancellationToken,
    /// Taken by the first `stop`; a concurrent `stop` waits on the lock until the writer
    /// has finished.
    task: tokio::sync::Mutex<Option<JoinHandle<()>>>,
}

impl<R: Send + 'static> GroupCommit<R> {
    /// Starts the writer task; `capacity` requests may wait for it before callers wait to
    /// enqueue (backpressure).
    pub(super) fn spawn<C: Committer<Request = R>>(
        name: &'static str,
        committer: C,
        capacity: usize,
    ) -> Self {
        let (request_tx, request_rx) = mpsc::channel(capacity);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run(committer, request_rx, shutdown.clone()));
        Self {
            name,
            request_tx,
            shutdown,
            task: tokio::sync::Mutex::new(Some(task)),
        }
    }

    /// Queues the request `request` builds around its reply sender, and waits until its
    /// batch is committed (or failed).
    pub(super) async fn send<T>(
        &self,
        request: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> R,
    ) -> Result<T, StoreError> {
        if self.shutdown.is_cancelled() {
            return Err(StoreError::Closed);
        }
        let (reply_tx, reply_rx) = oneshot::channel();
        if self.request_tx.send(request(reply_tx)).await.is_err() {
            // The queue is closed: by `stop`, or because the writer died.
            return Err(if self.shutdown.is_cancelled() {
                StoreError::Closed
            } else {
                StoreError::WriterStopped
            });
        }
        // Only a writer that died (a bug) drops a queued request unanswered; its
        // transaction, if it had begun, was rolled back with it.
        reply_rx.await.unwrap_or(Err(StoreError::WriterStopped))
    }

    /// Refuses new requests, lets the writer finish every one already queued, and waits
    /// for it.
    pub(super) async fn stop(&self) {
        self.shutdown.cancel();
        if let Some(handle) = self.task.lock().await.take() {
            match handle.await {
                Ok(()) => tracing::info!(task = self.name, "task exited"),
                Err(error) => tracing::error!(task = self.name, %error, "task panicked"),
            }
        }
    }
}

/// The writer task: one batch after another until the store closes (then the queue is
/// drained) or every sender is gone.
async fn run<C: Committer>(
    mut committer: C,
    mut request_rx: mpsc::Receiver<C::Request>,
    shutdown: CancellationToken,
) {
    let mut closing = false;
    loop {
        let first = tokio::select! {
            biased;
            _ = shutdown.cancelled(), if !closing => {
                // Refuse new requests; the ones already queued are still received below.
                request_rx.close();
                closing = true;
                continue;
            }
            request = request_rx.recv() => match request {
                Some(request) => request,
                None => break,
            },
        };
        committer.commit(first, &mut request_rx).await;
    }
}
