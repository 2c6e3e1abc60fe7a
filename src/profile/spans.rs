//! CPU phase times from tracing spans: a minimal subscriber that records when each span is
//! entered and exited. Installed only while profiling; otherwise tracing takes its disabled
//! path and the spans in the training step cost nothing measurable.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// One entered-and-exited span on the CPU.
#[derive(Clone, Debug)]
pub struct CpuSpan {
    pub name: &'static str,
    /// Microseconds since the collector started.
    pub start_us: f64,
    pub end_us: f64,
}

#[derive(Default)]
struct Shared {
    names: Vec<&'static str>,
    open: Vec<(u64, f64)>,
    done: Vec<CpuSpan>,
}

/// The subscriber; clone the handle to read what it collected.
#[derive(Clone)]
pub struct SpanCollector {
    origin: Instant,
    next_id: Arc<AtomicU64>,
    shared: Arc<Mutex<Shared>>,
}

impl Default for SpanCollector {
    fn default() -> Self {
        SpanCollector {
            origin: Instant::now(),
            next_id: Arc::new(AtomicU64::new(1)),
            shared: Arc::new(Mutex::new(Shared::default())),
        }
    }
}

impl SpanCollector {
    /// Every span closed so far, taken out of the collector.
    pub fn take(&self) -> Vec<CpuSpan> {
        std::mem::take(&mut self.lock().done)
    }

    /// Microseconds since the collector started (the trace's clock).
    pub fn now_us(&self) -> f64 {
        self.origin.elapsed().as_secs_f64() * 1e6
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Subscriber for SpanCollector {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.is_span()
    }

    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut s = self.lock();
        let index = id as usize;
        if s.names.len() <= index {
            s.names.resize(index + 1, "");
        }
        s.names[index] = attrs.metadata().name();
        Id::from_u64(id)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, _: &Event<'_>) {}

    fn enter(&self, id: &Id) {
        let now = self.now_us();
        self.lock().open.push((id.into_u64(), now));
    }

    fn exit(&self, id: &Id) {
        let now = self.now_us();
        let mut s = self.lock();
        if let Some(k) = s.open.iter().rposition(|(i, _)| *i == id.into_u64()) {
            let (i, start) = s.open.remove(k);
            let name = s.names.get(i as usize).copied().unwrap_or("span");
            s.done.push(CpuSpan {
                name,
                start_us: start,
                end_us: now,
            });
        }
    }
}
