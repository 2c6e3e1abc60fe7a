//! A Chrome trace (chrome://tracing, Perfetto) of profiled steps: CPU spans on one track, GPU
//! kernels on another. The GPU clock has its own origin: each step's kernels are placed so that
//! the last one ends when the step's synchronization returned (the step waits for the GPU).

use serde_json::{json, Value};

use super::StepRecord;

pub fn chrome_trace(steps: &[StepRecord]) -> Value {
    let mut events = vec![
        json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "CPU"}}),
        json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": 2, "args": {"name": "GPU"}}),
    ];
    for (k, s) in steps.iter().enumerate() {
        let end_us = s.start_us + s.wall_ms * 1e3;
        events.push(json!({"name": format!("step {k}"), "ph": "X", "pid": 1, "tid": 1, "ts": s.start_us, "dur": s.wall_ms * 1e3}));
        for c in &s.cpu {
            events.push(json!({"name": c.name, "ph": "X", "pid": 1, "tid": 1, "ts": c.start_us, "dur": c.end_us - c.start_us}));
        }
        if let Some(last) = s.gpu.iter().map(|i| i.end_ns).reduce(f64::max) {
            let shift_us = end_us - last * 1e-3;
            for i in &s.gpu {
                events.push(json!({
                    "name": i.label, "ph": "X", "pid": 1, "tid": 2,
                    "ts": i.start_ns * 1e-3 + shift_us,
                    "dur": (i.end_ns - i.start_ns) * 1e-3,
                    "args": {"variant": &*i.variant, "groups": i.groups},
                }));
            }
        }
    }
    json!({"traceEvents": events, "displayTimeUnit": "ms"})
}
