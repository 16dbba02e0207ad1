//! A gRPC client of the kubelet pod-resources API over its unix socket.
//!
//! One HTTP/2 channel is made lazily and reused: the socket is not touched until the first call,
//! a missing socket fails that call (and only it), and after the kubelet restarts the channel
//! reconnects on the next call. Every call carries a deadline, sent to the kubelet as
//! `grpc-timeout` and enforced here too.

use std::path::{Path, PathBuf};
use std::time::Duration;

use http::uri::PathAndQuery;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Code, Status};

use crate::sample::KubeletError;

use super::proto::wire::Wire;
use super::proto::{LIST_PATH, ListPodResourcesRequest, ListPodResourcesResponse};

/// The largest `List` answer accepted. tonic's default (4 MiB) is what kubelet clients hit on
/// dense nodes; 16 MiB is what the kubelet itself allows.
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// A `List` call that did not return pod resources.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ListError {
    /// The error counter's reason.
    pub reason: KubeletError,
    /// What went wrong, for the log.
    pub message: String,
}

impl ListError {
    fn from_status(status: &Status) -> ListError {
        let reason = match status.code() {
            Code::Unavailable => KubeletError::Unavailable,
            Code::DeadlineExceeded => KubeletError::Timeout,
            _ => KubeletError::Rpc,
        };
        // tonic puts the transport error (e.g. "No such file or directory") in the source chain.
        let mut message = format!("{}: {}", status.code(), status.message());
        let mut source = std::error::Error::source(status);
        while let Some(e) = source {
            message.push_str(&format!(": {e}"));
            source = e.source();
        }
        ListError { reason, message }
    }
}

/// A client of one kubelet socket.
#[derive(Debug, Clone)]
pub struct PodResourcesClient {
    grpc: tonic::client::Grpc<Channel>,
    socket: PathBuf,
    /// Entries of the last answer left out for strings that are not UTF-8 (logged on change).
    skipped: usize,
}

impl PodResourcesClient {
    /// A client for the socket at `socket`. Connects on the first call, so this needs a tokio
    /// runtime but no kubelet.
    pub fn new(socket: &Path) -> PodResourcesClient {
        let path = socket.to_path_buf();
        // The URI is required by the HTTP layer but unused: the connector below ignores it, and
        // the kubelet does not check the authority.
        let channel = Endpoint::from_static("http://localhost").connect_with_connector_lazy(
            tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move { UnixStream::connect(path).await.map(TokioIo::new) }
            }),
        );
        PodResourcesClient {
            grpc: tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_RESPONSE_BYTES),
            socket: socket.to_path_buf(),
            skipped: 0,
        }
    }

    /// The socket this client talks to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Calls `List`, giving up after `deadline` (connecting included).
    pub async fn list(
        &mut self,
        deadline: Duration,
    ) -> Result<ListPodResourcesResponse, ListError> {
        let started = tokio::time::Instant::now();
        match tokio::time::timeout(deadline, self.call(deadline)).await {
            Ok(Ok(wire)) => {
                let (response, skipped) = wire.checked();
                if skipped != self.skipped {
                    tracing::warn!(
                        socket = %self.socket.display(),
                        skipped,
                        "entries of the kubelet's pod-resources answer with a name that is not \
                         UTF-8 are left out (the rest is used)"
                    );
                    self.skipped = skipped;
                }
                Ok(response)
            }
            Ok(Err(status)) => {
                let mut error = ListError::from_status(&status);
                // A server that enforces the `grpc-timeout` it was sent answers at the deadline
                // (tonic with Cancelled); that answer can be read before our own timer fires.
                if started.elapsed() >= deadline {
                    error.reason = KubeletError::Timeout;
                }
                Err(error)
            }
            Err(_elapsed) => Err(ListError {
                reason: KubeletError::Timeout,
                message: format!("no answer within {}", humantime::format_duration(deadline)),
            }),
        }
    }

    async fn call(&mut self, deadline: Duration) -> Result<Wire, Status> {
        self.grpc
            .ready()
            .await
            .map_err(|e| Status::from_error(Box::new(e)))?;
        let mut request = tonic::Request::new(ListPodResourcesRequest {});
        request.set_timeout(deadline);
        let codec = tonic_prost::ProstCodec::default();
        let response = self
            .grpc
            .unary(request, PathAndQuery::from_static(LIST_PATH), codec)
            .await?;
        Ok(response.into_inner())
    }
}
