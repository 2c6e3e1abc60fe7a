//! The pipeline cache's compile workers: a variant is queued where it is first asked for and
//! waited for where it is needed; a variant that does not compile is reported there, naming
//! the kernel, and the variants queued around it compile.

mod common;

use common::private_dev;
use wgrad::kernels::{Access, Family, KernelDesc, PipelineCache, Spec};

/// A kernel's WGSL: the params uniform and one read-write buffer, then `$entry`.
macro_rules! kernel_source {
    ($entry:literal) => {
        concat!(
            "struct Params { n: u32, _a: u32, _b: u32, _c: u32 }\n",
            "@group(0) @binding(0) var<uniform> p: Params;\n",
            "@group(0) @binding(1) var<storage, read_write> y: array<f32>;\n",
            "@compute @workgroup_size(64)\n",
            $entry
        )
    };
}

static GOOD: Family = Family {
    name: "test_good",
    source: kernel_source!(
        "fn test_fill(@builtin(global_invocation_id) id: vec3<u32>) {
            if id.x < p.n { y[id.x] = VALUE; }
        }"
    ),
    workgroup_reduce: false,
};

static BROKEN: Family = Family {
    name: "test_broken",
    source: kernel_source!(
        "fn test_broken(@builtin(global_invocation_id) id: vec3<u32>) {
            y[id.x] = not_declared_anywhere;
        }"
    ),
    workgroup_reduce: false,
};

static FILL: KernelDesc = KernelDesc {
    name: "test_fill",
    family: &GOOD,
    storage: &[Access::ReadWrite],
    params_size: 16,
};

static BROKEN_KERNEL: KernelDesc = KernelDesc {
    name: "test_broken",
    family: &BROKEN,
    storage: &[Access::ReadWrite],
    params_size: 16,
};

fn fill_spec(v: &'static str) -> Spec {
    Spec::new().source("VALUE", v)
}

#[test]
fn variants_compile_on_workers_and_a_broken_one_names_its_kernel() {
    let dev = private_dev();
    let device = &dev.gpu().device;
    let mut cache = PipelineCache::new(true, 65535, Some(2), false);
    let specs = [
        "const VALUE: f32 = 1.0;",
        "const VALUE: f32 = 2.0;",
        "const VALUE: f32 = 3.0;",
    ];
    // Queued, not compiled: get returns at once, the same handle on a second ask.
    let first: Vec<_> = specs
        .iter()
        .map(|s| cache.get(device, &FILL, &fill_spec(s)))
        .collect();
    let again = cache.get(device, &FILL, &fill_spec(specs[0]));
    assert!(std::sync::Arc::ptr_eq(&first[0], &again));
    assert_eq!(cache.stats().pipelines_compiled, 3);
    assert_eq!(cache.stats().compile_threads, 2);

    let broken = cache.get(device, &BROKEN_KERNEL, &Spec::new());
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        broken.compute();
    }))
    .expect_err("a kernel that does not compile cannot be used");
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        msg.contains("test_broken") && msg.contains("did not compile"),
        "{msg}"
    );

    // Variants queued around the failure compile.
    let later = cache.get(device, &FILL, &fill_spec("const VALUE: f32 = 4.0;"));
    later.compute();
    for p in &first {
        p.compute();
        assert!(p.is_compiled());
    }
    assert!(cache.stats().compile_ms > 0.0);
}
