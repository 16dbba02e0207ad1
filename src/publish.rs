//! The current exposition: what every request is served until the next one replaces it.
//!
//! The sampler hands each tick's snapshot to [`Publisher::tick`], which attaches the kubelet's
//! latest answer and the HPC job mapping files (read there, [`crate::jobs`]), splits the
//! devices' busy time among the containers holding them ([`WorkloadLedger`]), counts the tick,
//! encodes it and swaps the result in. When the kubelet's
//! assignments change between ticks, [`Publisher::republish`] encodes the last snapshot
//! again with them, so pod labels follow the kubelet within one refresh. HTTP only reads
//! [`Publisher::current`]: a scrape never calls NVML and never encodes, and the gzip form is made
//! by the first request that asks for it ([`Published::gzip`]), as the node page and its JSON
//! are ([`Published::page`]). A configuration reload
//! [reconfigures](Publisher::reconfigure) the encoding and the kubelet state, and the last
//! snapshot is encoded again with them at once.

use std::io::Write;
use std::sync::{Arc, Mutex, RwLock};

use axum::body::Bytes;
use flate2::Compression;
use flate2::write::GzEncoder;
use tokio::sync::OnceCell;
use tokio::task::JoinError;

use crate::groups::{Group, Groups};
use crate::jobs::JobReader;
use crate::kubernetes::StateHandle;
use crate::metrics::workloads::WorkloadLedger;
use crate::metrics::{Encoder, Encoding, MetricsOptions};
use crate::sample::Snapshot;

/// gzip level of [`Published::gzip`]: the fastest, since the first gzip scrape of a tick waits
/// for the compression and a third more bytes on a LAN cost less than several times the CPU.
const GZIP_LEVEL: Compression = Compression::fast();

/// One exposition and the snapshot it was encoded from, served together so that a response never
/// mixes two ticks.
#[derive(Debug)]
pub struct Published {
    /// Text format 0.0.4.
    pub text: Bytes,
    /// `text` gzip-compressed, made by the first [`gzip`](Self::gzip) call.
    gzip: OnceCell<Bytes>,
    /// The node page of this snapshot, and its JSON, each made by the first request for it
    /// ([`page`](Self::page)).
    page: [OnceCell<Bytes>; 2],
    /// What was encoded (for `/readyz`, the node page and the OTLP push).
    pub snapshot: Arc<Snapshot>,
    /// The options it was encoded with.
    pub options: Arc<MetricsOptions>,
    /// The collector groups whose native families `text` serves (`--max-series` may have left
    /// some out): the OTLP push writes the same series from `snapshot`.
    pub groups: Groups,
    /// False only for the placeholder served before the sampler's first tick.
    pub sampled: bool,
}

impl Published {
    /// The publication of `snapshot`, encoded as `encoding`.
    fn new(encoding: Encoding, snapshot: Arc<Snapshot>, sampled: bool) -> Published {
        Published {
            text: Bytes::from(encoding.text),
            gzip: OnceCell::new(),
            page: Default::default(),
            snapshot,
            options: encoding.options,
            groups: encoding.groups,
            sampled,
        }
    }

    /// `text`, gzip-compressed. Compresses on the first call only, on one blocking thread (it
    /// takes milliseconds on large bodies, which must not stall the async workers): Prometheus
    /// scrapes every 15–60 s while ticks come every second, so most ticks are never asked for
    /// gzip, and the other requests of the tick that arrive meanwhile wait for that compression
    /// without holding a thread. `Err` only if compressing panicked; the next call tries again.
    pub async fn gzip(&self) -> Result<Bytes, JoinError> {
        self.compressed_with(gzip).await
    }

    /// [`gzip`](Self::gzip) with the compression passed in (tests count its calls).
    async fn compressed_with(
        &self,
        compress: impl FnOnce(&[u8]) -> Vec<u8> + Send + 'static,
    ) -> Result<Bytes, JoinError> {
        self.gzip
            .get_or_try_init(|| {
                let text = self.text.clone();
                async move {
                    tokio::task::spawn_blocking(move || Bytes::from(compress(&text))).await
                }
            })
            .await
            .cloned()
    }

    /// The node page of this snapshot in `form`, rendered by `render` on the first call only, on
    /// a blocking thread, as [`gzip`](Self::gzip) is made: a flood of page requests costs one
    /// rendering per publication, and every response shares its bytes. `Err` only if rendering
    /// panicked.
    pub async fn page(
        &self,
        form: PageForm,
        render: impl FnOnce() -> Bytes + Send + 'static,
    ) -> Result<Bytes, JoinError> {
        self.page[form as usize]
            .get_or_try_init(|| async move { tokio::task::spawn_blocking(render).await })
            .await
            .cloned()
    }

    /// The gzip form, if an earlier [`gzip`](Self::gzip) call made it.
    #[cfg(test)]
    fn gzip_if_ready(&self) -> Option<Bytes> {
        self.gzip.get().cloned()
    }
}

/// The forms the node page is served in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageForm {
    /// `/`.
    Html = 0,
    /// `/api/v1/gpus`.
    Json = 1,
}

/// Owns the current exposition.
#[derive(Debug)]
pub struct Publisher {
    encoder: Encoder,
    /// The kubelet's latest answer, with `--kubernetes`.
    kubelet: Mutex<Option<StateHandle>>,
    /// The reader of `--hpc-job-mapping-dir`, read at every tick.
    jobs: Mutex<Option<JobReader>>,
    /// GPU-seconds per container, added to at every tick (with `--kubernetes`).
    workloads: Mutex<WorkloadLedger>,
    /// The last snapshot from the sampler, kept to encode again when the kubelet's assignments
    /// change. Its lock also orders encodings, so a newer exposition never gets replaced by an
    /// older one.
    last: Mutex<Option<Arc<Snapshot>>>,
    current: RwLock<Arc<Published>>,
}

impl Publisher {
    /// Serves the exposition of an empty snapshot (`nvml_exporter_nvml_up 0`) until the first
    /// [`tick`](Self::tick); with `kubelet`, each snapshot carries its latest answer.
    pub fn new(encoder: Encoder, kubelet: Option<StateHandle>) -> Arc<Publisher> {
        let empty = Arc::new(Snapshot::default());
        let placeholder = Published::new(encoder.encoding(&empty), empty, false);
        Arc::new(Publisher {
            encoder,
            kubelet: Mutex::new(kubelet),
            jobs: Mutex::new(None),
            workloads: Mutex::new(WorkloadLedger::default()),
            last: Mutex::new(None),
            current: RwLock::new(Arc::new(placeholder)),
        })
    }

    /// Publishes one sampling tick: called by the sampler after every tick.
    pub fn tick(&self, mut snapshot: Snapshot) {
        snapshot.kubernetes = self.kubelet_state();
        snapshot.jobs = self
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .map(|reader| reader.read(&snapshot.devices));
        let opts = self.encoder.options();
        let mut ledger = self.workloads.lock().unwrap_or_else(|e| e.into_inner());
        if snapshot.kubernetes.is_some() && opts.groups.contains(Group::Workloads) {
            // Only here, once a tick: a republish serves these totals again, never adds to them.
            snapshot.workloads = Some(ledger.tick(&snapshot, &opts));
        } else {
            // Off (a reload can turn it on again): what the devices gain meanwhile is nobody's.
            *ledger = WorkloadLedger::default();
        }
        drop(ledger);
        let snapshot = Arc::new(snapshot);
        let mut last = self.lock_last();
        if let Some(seconds) = snapshot.tick_duration_seconds {
            self.encoder.observe_tick(seconds);
        }
        self.publish(&snapshot);
        *last = Some(snapshot);
    }

    /// Encodes the last tick again with the kubelet's latest answer (called when the GPU
    /// assignments or the pod list change), without counting a tick.
    pub fn republish(&self) {
        let last = self.lock_last();
        let Some(previous) = last.as_deref() else {
            return;
        };
        let mut snapshot = previous.clone();
        snapshot.kubernetes = self.kubelet_state();
        self.publish(&Arc::new(snapshot));
    }

    /// Encodes with `opts` and the kubelet state of `kubelet` from the next publish on (a
    /// configuration reload, which then [publishes again](Self::republish) with its outcome).
    pub fn reconfigure(&self, opts: MetricsOptions, kubelet: Option<StateHandle>) {
        self.encoder.set_options(opts);
        *self.kubelet.lock().unwrap_or_else(|e| e.into_inner()) = kubelet;
    }

    /// The options encodings use now (the node page builds its view with them).
    pub fn options(&self) -> Arc<MetricsOptions> {
        self.encoder.options()
    }

    /// Reads the HPC job mapping files of `dir` at every tick from the next on, or none. The
    /// same directory as before keeps its reader, and so its error counts.
    pub fn set_job_mapping_dir(&self, dir: Option<&std::path::Path>) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        if jobs.as_ref().map(JobReader::dir) != dir {
            *jobs = dir.map(|dir| JobReader::new(dir.to_owned()));
        }
    }

    /// The latest kubelet state, with `--kubernetes`.
    fn kubelet_state(&self) -> Option<crate::sample::KubernetesState> {
        self.kubelet
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(StateHandle::current)
    }

    /// What requests are served now.
    pub fn current(&self) -> Arc<Published> {
        // Clone the Arc and drop the guard at once: a slow client never holds up a publish.
        // A poisoned lock only means a writer panicked mid-swap of an Arc; the value is whole.
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn publish(&self, snapshot: &Arc<Snapshot>) {
        let encoding = self.encoder.encoding(snapshot);
        let published = Arc::new(Published::new(encoding, Arc::clone(snapshot), true));
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = published;
    }

    fn lock_last(&self) -> std::sync::MutexGuard<'_, Option<Arc<Snapshot>>> {
        self.last.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::with_capacity(data.len() / 4), GZIP_LEVEL);
    // Writing to a Vec cannot fail.
    if let Err(e) = encoder.write_all(data) {
        tracing::error!(error = %e, "gzip of the exposition failed");
    }
    encoder.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;
    use crate::metrics::MetricsOptions;
    use crate::sample::{ContainerRef, DeviceRef, DeviceSample, KubernetesState, PodAssignment};

    fn snapshot() -> Snapshot {
        Snapshot {
            nvml_up: true,
            devices: vec![Arc::new(DeviceSample {
                index: 0,
                uuid: "GPU-abc".into(),
                up: true,
                power_watts: Some(250.0),
                ..Default::default()
            })],
            tick_duration_seconds: Some(0.01),
            last_tick_timestamp_seconds: Some(1_700_000_000.0),
            ..Default::default()
        }
    }

    fn text(p: &Publisher) -> String {
        String::from_utf8(p.current().text.to_vec()).unwrap()
    }

    fn publisher(kubelet: Option<StateHandle>) -> Arc<Publisher> {
        Publisher::new(
            Encoder::new(MetricsOptions::default(), prometheus::Registry::new()),
            kubelet,
        )
    }

    #[test]
    fn before_the_first_tick_nvml_reads_down() {
        let p = publisher(None);
        assert!(!p.current().sampled);
        assert!(
            text(&p).contains("\nnvml_exporter_nvml_up 0\n"),
            "{}",
            text(&p)
        );
        p.tick(snapshot());
        assert!(p.current().sampled);
        assert!(text(&p).contains("\nnvml_exporter_nvml_up 1\n"));
    }

    #[test]
    fn the_job_mapping_directory_is_read_at_each_tick_and_follows_a_reload() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::write(a.path().join("0"), "17\n").unwrap();
        std::fs::write(b.path().join("0"), "18\n").unwrap();
        let job = |p: &Publisher| -> Vec<String> {
            let snapshot = &p.current().snapshot;
            snapshot
                .jobs
                .iter()
                .flat_map(|j| j.jobs.iter().map(|j| j.job.clone()))
                .collect()
        };
        let p = publisher(None);
        p.tick(snapshot());
        assert!(p.current().snapshot.jobs.is_none());
        p.set_job_mapping_dir(Some(a.path()));
        p.tick(snapshot());
        assert_eq!(job(&p), ["17"]);
        assert!(text(&p).contains(r#"hpc_job="17""#));
        std::fs::write(a.path().join("0"), "19\n").unwrap();
        p.republish();
        assert_eq!(job(&p), ["17"], "read at a tick, not at a republish");
        p.tick(snapshot());
        assert_eq!(job(&p), ["19"]);
        p.set_job_mapping_dir(Some(b.path()));
        p.tick(snapshot());
        assert_eq!(job(&p), ["18"]);
        p.set_job_mapping_dir(None);
        p.tick(snapshot());
        assert!(p.current().snapshot.jobs.is_none());
    }

    /// The kubelet up, assigning the test device to ml/train-0/main.
    fn train_0_holds_the_gpu() -> KubernetesState {
        let mut state = KubernetesState::new();
        state.up = true;
        state.assignments = Arc::from(vec![PodAssignment {
            container: ContainerRef {
                namespace: "ml".into(),
                pod: "train-0".into(),
                container: "main".into(),
            },
            device: DeviceRef::GpuUuid("GPU-abc".into()),
            claim: String::new(),
        }]);
        state
    }

    #[test]
    fn gpu_seconds_are_counted_only_while_attribution_is_on() {
        let kubelet = StateHandle::from(train_0_holds_the_gpu());
        let after = |sampled: f64| {
            let mut s = snapshot();
            Arc::make_mut(&mut s.devices[0]).busy.sampled = sampled;
            s
        };
        let held = |p: &Publisher| -> Vec<f64> {
            let snapshot = &p.current().snapshot;
            snapshot
                .workloads
                .iter()
                .flat_map(|w| w.iter().map(|w| w.held))
                .collect()
        };
        let p = publisher(Some(kubelet.clone()));
        p.tick(after(0.0));
        p.tick(after(1.0));
        assert_eq!(held(&p), [1.0]);
        // A reload turns attribution off for 10 s, then on again: those 10 s are nobody's.
        p.reconfigure(MetricsOptions::default(), None);
        p.tick(after(11.0));
        assert!(p.current().snapshot.workloads.is_none());
        p.reconfigure(MetricsOptions::default(), Some(kubelet));
        p.tick(after(11.0));
        p.tick(after(12.0));
        assert_eq!(held(&p), [1.0], "counted again from its first tick back");
    }

    #[test]
    fn a_kubelet_change_is_served_at_once_without_counting_a_tick() {
        let kubelet = StateHandle::from(KubernetesState::new());
        let p = publisher(Some(kubelet.clone()));
        p.republish(); // before any tick: nothing to serve
        assert!(!p.current().sampled);

        p.tick(snapshot());
        assert!(text(&p).contains("nvml_exporter_kubernetes_up 0\n"));
        kubelet.replace(train_0_holds_the_gpu());
        p.republish();
        let text = text(&p);
        assert!(text.contains(r#"nvidia_gpu_pod_info{gpu="0",uuid="GPU-abc",namespace="ml",pod="train-0",container="main"} 1"#), "{text}");
        assert!(
            text.contains("nvidia_gpu_power_watts{"),
            "the tick's readings are kept"
        );
        assert!(text.contains("nvml_exporter_kubernetes_up 1\n"), "{text}");
        assert!(
            text.contains("nvml_exporter_sample_duration_seconds_count 1\n"),
            "one tick, not two: {text}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn gzip_decodes_to_the_text_and_is_made_once() {
        let p = publisher(None);
        p.tick(snapshot());
        let current = p.current();
        assert_eq!(current.gzip_if_ready(), None, "gzip is made on demand");
        let gz = current.gzip().await.unwrap();
        let mut decoded = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut decoded)
            .unwrap();
        assert_eq!(decoded, current.text);
        assert!(gz.len() < current.text.len());
        // Every request of this tick shares the one compression.
        let again = p.current();
        assert_eq!(again.gzip_if_ready().map(|b| b.as_ptr()), Some(gz.as_ptr()));
        assert_eq!(again.gzip().await.unwrap().as_ptr(), gz.as_ptr());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_waiters_share_one_compression() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let p = publisher(None);
        p.tick(snapshot());
        let current = p.current();
        let compressions = Arc::new(AtomicUsize::new(0));
        // The compression holds its blocking thread until every waiter has asked, so they all
        // wait at once.
        let (asked_tx, asked_rx) = std::sync::mpsc::channel::<()>();
        let asked_rx = Arc::new(Mutex::new(asked_rx));
        const WAITERS: usize = 200;
        let waiters: Vec<_> = (0..WAITERS)
            .map(|_| {
                let (current, compressions) = (Arc::clone(&current), Arc::clone(&compressions));
                let (asked_tx, asked_rx) = (asked_tx.clone(), Arc::clone(&asked_rx));
                tokio::spawn(async move {
                    let _ = asked_tx.send(());
                    current
                        .compressed_with(move |text| {
                            compressions.fetch_add(1, Ordering::SeqCst);
                            let asked = asked_rx.lock().unwrap();
                            for _ in 0..WAITERS {
                                asked.recv().unwrap();
                            }
                            gzip(text)
                        })
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut bodies = Vec::new();
        for w in waiters {
            bodies.push(w.await.unwrap());
        }
        assert_eq!(compressions.load(Ordering::SeqCst), 1, "one compression");
        let made = current.gzip_if_ready().expect("compressed");
        assert!(
            bodies.iter().all(|b| b.as_ptr() == made.as_ptr()),
            "every waiter got the bytes of the one compression"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_page_is_rendered_once_per_publication_and_form() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let p = publisher(None);
        p.tick(snapshot());
        let renders = Arc::new(AtomicUsize::new(0));
        let page = |form: PageForm, body: &'static str| {
            let (current, renders) = (p.current(), Arc::clone(&renders));
            async move {
                current
                    .page(form, move || {
                        renders.fetch_add(1, Ordering::SeqCst);
                        Bytes::from_static(body.as_bytes())
                    })
                    .await
                    .unwrap()
            }
        };
        let first = page(PageForm::Html, "<html>").await;
        for _ in 0..50 {
            let again = page(PageForm::Html, "not rendered").await;
            assert_eq!(again.as_ptr(), first.as_ptr(), "the same bytes, shared");
        }
        assert_eq!(page(PageForm::Json, "{}").await, "{}");
        assert_eq!(renders.load(Ordering::SeqCst), 2, "one per form");
        // The next publication renders anew.
        p.tick(snapshot());
        assert_eq!(page(PageForm::Html, "<html> 2").await, "<html> 2");
        assert_eq!(renders.load(Ordering::SeqCst), 3);
    }
}
