//! Kernels as named values.
//!
//! Each WGSL family (`wgsl/<family>.wgsl`) has a launcher module here holding one typed
//! descriptor per entry point: its name (entry point and label), its storage bindings (the
//! "function signature" of the shader), and a `#[repr(C)]` params struct mirrored in WGSL.
//! Binding 0 of every kernel is that params struct, a uniform read at a dynamic offset in the
//! per-flush parameter arena; storage bindings follow from 1 in the order the descriptor lists.
//!
//! A specialization (`Spec`) is a set of WGSL constants and type aliases prepended to the family
//! source (`const OP: u32 = 3u;`, `alias V = vec4<f32>;`), so every variant is an ordinary
//! module that naga validates and translates on its own. Pipelines are cached by
//! (kernel, specialization), compiled on worker threads from the moment they are first recorded
//! (`compile`), and can all be compiled ahead with `PipelineCache::warmup`.

pub mod absmax;
pub mod adamw;
pub mod attention;
pub mod attention_coop;
pub mod cast;
mod compile;
pub mod count_nonfinite;
pub mod cross_entropy;
mod dtype;
pub mod elementwise;
pub mod gather;
pub mod layernorm;
pub mod loss_scale;
pub mod matmul;
pub mod matmul_coop;
pub mod named;
#[cfg(feature = "lab")]
pub mod peak;
pub mod random;
pub mod reduce;
pub mod rmsnorm;
pub mod scatter;
pub mod softmax;
pub mod swiglu;
pub mod tuning;

pub use dtype::DType;

use rustc_hash::FxHashMap as HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};

use serde::Serialize;

/// How a kernel's storage binding is accessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    Read,
    ReadWrite,
}

/// One WGSL source file.
pub struct Family {
    pub name: &'static str,
    pub source: &'static str,
    /// Whether the source calls the workgroup reductions (`wg_sum`, `wg_max`), which are
    /// prepended in their subgroup or their workgroup-memory form.
    pub workgroup_reduce: bool,
}

/// One entry point of a family: what a pipeline is made from.
pub struct KernelDesc {
    pub name: &'static str,
    pub family: &'static Family,
    /// Storage bindings 1..=n (binding 0 is the params uniform).
    pub storage: &'static [Access],
    /// `size_of` the params struct (a multiple of 16, as WGSL lays out uniforms).
    pub params_size: u64,
}

impl KernelDesc {
    fn key(&'static self) -> usize {
        self as *const KernelDesc as usize
    }
}

/// A value of a specialization constant.
#[derive(Clone, Copy, Debug)]
pub enum SpecValue {
    U32(u32),
    Bool(bool),
    /// A WGSL type, declared as `alias NAME = type;`.
    Type(&'static str),
    /// WGSL source inserted before the family's (a snippet that completes it: aliases,
    /// constants and helpers the family leaves to its variants): an `include_str!` constant or
    /// a text generated once per configuration and kept (see `matmul_coop::generated`), so
    /// equal snippets share one address.
    Source(&'static str),
}

/// WGSL constants and aliases that select one variant of a kernel.
///
/// Compared and hashed by value, but a name, type or snippet by its address: they are
/// `&'static str` constants, so the lookup a dispatch makes (`PipelineCache::get`) hashes and
/// compares a few words an entry, not their texts (one text at two addresses would only make
/// a second, equal pipeline).
#[derive(Clone, Debug, Default)]
pub struct Spec(pub Vec<(&'static str, SpecValue)>);

impl PartialEq for Spec {
    fn eq(&self, other: &Spec) -> bool {
        self.words().eq(other.words())
    }
}

impl Eq for Spec {}

impl std::hash::Hash for Spec {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        h.write_usize(self.0.len());
        for w in self.words() {
            w.hash(h);
        }
    }
}

/// Entries a Spec makes room for at once: the cooperative-matrix matmul's, the most, are 37,
/// and a Spec is built for every dispatch (growing it one push at a time reallocated it 4 times).
const SPEC_ROOM: usize = 40;

impl SpecValue {
    /// The value as words, a text as its address and length.
    fn words(&self) -> (u8, usize, usize) {
        match *self {
            SpecValue::U32(x) => (0, x as usize, 0),
            SpecValue::Bool(x) => (1, x as usize, 0),
            SpecValue::Type(t) => (2, t.as_ptr() as usize, t.len()),
            SpecValue::Source(t) => (3, t.as_ptr() as usize, t.len()),
        }
    }
}

impl Spec {
    pub fn new() -> Spec {
        Spec(Vec::with_capacity(SPEC_ROOM))
    }

    /// Each entry as words: its name's address and length, then its value's.
    fn words(&self) -> impl Iterator<Item = (usize, usize, (u8, usize, usize))> + '_ {
        self.0
            .iter()
            .map(|(name, v)| (name.as_ptr() as usize, name.len(), v.words()))
    }

    pub fn u32(mut self, name: &'static str, v: u32) -> Spec {
        self.0.push((name, SpecValue::U32(v)));
        self
    }

    /// The constant `name` set to `v`: its entry's value replaced, or an entry added.
    pub fn with_u32(mut self, name: &'static str, v: u32) -> Spec {
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some(entry) => entry.1 = SpecValue::U32(v),
            None => self.0.push((name, SpecValue::U32(v))),
        }
        self
    }

    /// The type alias `name` set to `v`: its entry's value replaced, or an entry added.
    pub fn with_ty(mut self, name: &'static str, v: &'static str) -> Spec {
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some(entry) => entry.1 = SpecValue::Type(v),
            None => self.0.push((name, SpecValue::Type(v))),
        }
        self
    }

    /// The snippet `name` set to `text`: its entry's text replaced, or an entry added.
    pub fn with_source(mut self, name: &'static str, text: &'static str) -> Spec {
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some(entry) => entry.1 = SpecValue::Source(text),
            None => self.0.push((name, SpecValue::Source(text))),
        }
        self
    }

    pub fn bool(mut self, name: &'static str, v: bool) -> Spec {
        self.0.push((name, SpecValue::Bool(v)));
        self
    }

    /// The constant `name` set to `v`: its entry's value replaced, or an entry added.
    pub fn with_bool(mut self, name: &'static str, v: bool) -> Spec {
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some(entry) => entry.1 = SpecValue::Bool(v),
            None => self.0.push((name, SpecValue::Bool(v))),
        }
        self
    }

    pub fn ty(mut self, name: &'static str, v: &'static str) -> Spec {
        self.0.push((name, SpecValue::Type(v)));
        self
    }

    /// A snippet of WGSL, named `name` in labels.
    pub fn source(mut self, name: &'static str, text: &'static str) -> Spec {
        self.0.push((name, SpecValue::Source(text)));
        self
    }

    /// A short text for labels: `OP=3,V=vec4<f32>`.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        for (i, (name, v)) in self.0.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            let _ = match v {
                SpecValue::U32(x) => write!(s, "{name}={x}"),
                SpecValue::Bool(x) => write!(s, "{name}={x}"),
                SpecValue::Type(x) => write!(s, "{name}={x}"),
                SpecValue::Source(x) => write!(s, "{name}={}", x.lines().next().unwrap_or("")),
            };
        }
        s
    }
}

const REDUCE_SUBGROUP: &str = include_str!("../../wgsl/workgroup_reduce_subgroup.wgsl");
const REDUCE_TREE: &str = include_str!("../../wgsl/workgroup_reduce_tree.wgsl");

/// The complete WGSL of one kernel variant: enables (`enable f16;` when an alias names f16,
/// and the family's own `enable` lines, hoisted), constants, helpers, then the family.
pub fn compose_source(family: &Family, spec: &Spec, subgroups: bool) -> String {
    let mut src = String::new();
    let uses_f16 = spec.0.iter().any(|(_, v)| {
        matches!(v, SpecValue::Type(t) if t.contains("f16"))
            || matches!(v, SpecValue::Source(t) if t.contains("f16"))
    });
    if uses_f16 {
        src.push_str("enable f16;\n");
    }
    let is_enable = |l: &str| l.starts_with("enable ") && l.trim_end().ends_with(';');
    for line in family.source.lines().filter(|l| is_enable(l)) {
        src.push_str(line);
        src.push('\n');
    }
    // naga 30 takes subgroup builtins without `enable subgroups;` (it rejects the directive
    // as not yet implemented); the device feature is what allows them.
    for (name, v) in &spec.0 {
        let _ = match v {
            SpecValue::U32(x) => writeln!(src, "const {name}: u32 = {x}u;"),
            SpecValue::Bool(x) => writeln!(src, "const {name}: bool = {x};"),
            SpecValue::Type(x) => writeln!(src, "alias {name} = {x};"),
            SpecValue::Source(_) => Ok(()),
        };
    }
    for (_, v) in &spec.0 {
        if let SpecValue::Source(text) = v {
            src.push_str(text);
            src.push('\n');
        }
    }
    if family.workgroup_reduce {
        src.push_str(if subgroups {
            REDUCE_SUBGROUP
        } else {
            REDUCE_TREE
        });
    }
    for line in family.source.lines().filter(|l| !is_enable(l)) {
        src.push_str(line);
        src.push('\n');
    }
    src
}

/// The bind-group layout of a kernel (shared by every kernel with the same signature).
pub struct BindLayout {
    pub id: u64,
    pub layout: wgpu::BindGroupLayout,
    pub pipeline_layout: wgpu::PipelineLayout,
    pub params_size: u64,
    pub storage: &'static [Access],
}

/// A kernel variant: its layout and labels at once, its compiled pipeline once a worker has
/// made it (`compute` waits for it).
pub struct Pipeline {
    compiled: OnceLock<std::result::Result<wgpu::ComputePipeline, String>>,
    pub layout: Arc<BindLayout>,
    pub label: &'static str,
    /// The specialization (`Spec::describe`): which variant of the kernel, for profiles.
    pub variant: Arc<str>,
    /// The workgroup-count limit per grid dimension, for `grid`.
    pub max_groups: u32,
    /// Microseconds its compile took on its worker (naga and the driver), once compiled.
    compile_us: std::sync::atomic::AtomicU64,
}

impl Pipeline {
    /// The compiled pipeline, waiting for its worker if it is still compiling; what went wrong
    /// if it did not compile.
    pub fn wait(&self) -> std::result::Result<&wgpu::ComputePipeline, String> {
        self.compiled.wait().as_ref().map_err(|e| {
            format!(
                "kernel {} ({}) did not compile: {e}",
                self.label, self.variant
            )
        })
    }

    /// `wait`, for a pipeline known to be compiled or needed now.
    pub fn compute(&self) -> &wgpu::ComputePipeline {
        // The sources are the engine's own: a variant that does not compile is a bug in it.
        self.wait().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Whether `wait` returns without waiting.
    pub fn is_compiled(&self) -> bool {
        self.compiled.get().is_some()
    }
}

/// Counters of the pipeline cache.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct PipelineStats {
    /// Variants asked for so far: each is compiled once (some may still be compiling).
    pub pipelines_compiled: u64,
    /// Milliseconds of compiling, summed over the workers (several run at once).
    pub compile_ms: f64,
    /// Worker threads (0: each variant compiled where it was first recorded).
    pub compile_threads: usize,
}

pub struct PipelineCache {
    subgroups: bool,
    /// Whether naga's runtime bounds checks stay in (WGRAD_SHADER_CHECKS=1).
    checked: bool,
    max_groups: u32,
    /// By kernel, then specialization: a lookup borrows the Spec (no clone per dispatch).
    pipelines: HashMap<usize, HashMap<Spec, Arc<Pipeline>>>,
    layouts: HashMap<(&'static [Access], u64), Arc<BindLayout>>,
    next_layout_id: u64,
    compiler: compile::Compiler,
}

impl PipelineCache {
    /// `compile_threads`: `Execution::compile_threads`; `checked`: naga's bounds checks in
    /// every kernel (`KernelPolicy::shader_checks`).
    pub fn new(
        subgroups: bool,
        max_groups: u32,
        compile_threads: Option<usize>,
        checked: bool,
    ) -> PipelineCache {
        PipelineCache {
            subgroups,
            checked,
            max_groups,
            pipelines: HashMap::default(),
            layouts: HashMap::default(),
            next_layout_id: 1,
            compiler: compile::Compiler::with_threads(compile_threads),
        }
    }

    /// The `n` compiled variants whose compiles took longest: (kernel, variant, milliseconds),
    /// longest first.
    pub fn slowest_compiles(&self, n: usize) -> Vec<(&'static str, Arc<str>, f64)> {
        let mut all: Vec<_> = self
            .pipelines
            .values()
            .flat_map(|m| m.values())
            .map(|p| {
                let us = p.compile_us.load(std::sync::atomic::Ordering::Relaxed);
                (p.label, p.variant.clone(), us as f64 * 1e-3)
            })
            .collect();
        all.sort_by(|a, b| b.2.total_cmp(&a.2));
        all.truncate(n);
        all
    }

    pub fn stats(&self) -> PipelineStats {
        PipelineStats {
            pipelines_compiled: self.pipelines.values().map(|m| m.len() as u64).sum(),
            compile_ms: self.compiler.busy_ms(),
            compile_threads: self.compiler.threads(),
        }
    }

    pub fn subgroups(&self) -> bool {
        self.subgroups
    }

    /// The pipeline of `kernel` specialized by `spec`; the first call queues its compile on a
    /// worker and returns at once (`Pipeline::compute` waits for it).
    pub fn get(
        &mut self,
        device: &wgpu::Device,
        kernel: &'static KernelDesc,
        spec: &Spec,
    ) -> Arc<Pipeline> {
        if let Some(p) = self.pipelines.get(&kernel.key()).and_then(|m| m.get(spec)) {
            return p.clone();
        }
        let p = Arc::new(Pipeline {
            compiled: OnceLock::new(),
            layout: self.layout(device, kernel),
            label: kernel.name,
            variant: spec.describe().into(),
            max_groups: self.max_groups,
            compile_us: std::sync::atomic::AtomicU64::new(0),
        });
        let job = {
            let (p, device, spec) = (p.clone(), device.clone(), spec.clone());
            let (subgroups, checked) = (self.subgroups, self.checked);
            move || {
                let start = std::time::Instant::now();
                let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    compile(&device, kernel, &spec, &p.layout, subgroups, checked)
                }));
                p.compile_us.store(
                    start.elapsed().as_micros() as u64,
                    std::sync::atomic::Ordering::Relaxed,
                );
                let made = made.map_err(|e| {
                    e.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "the compile panicked".into())
                });
                // Set once: this job is the variant's only compile.
                let _ = p.compiled.set(made);
            }
        };
        self.compiler.run(job);
        self.pipelines
            .entry(kernel.key())
            .or_default()
            .insert(spec.clone(), p.clone());
        p
    }

    /// Runs `job` on the compile workers, queued behind the compiles asked for so far (tests
    /// hold the workers with it).
    #[cfg(test)]
    pub(crate) fn run_on_workers(&mut self, job: impl FnOnce() + Send + 'static) {
        self.compiler.run(job);
    }

    fn layout(&mut self, device: &wgpu::Device, kernel: &KernelDesc) -> Arc<BindLayout> {
        let key = (kernel.storage, kernel.params_size);
        if let Some(l) = self.layouts.get(&key) {
            return l.clone();
        }
        let mut entries = vec![wgpu::BindGroupLayoutEntry {
            binding: 0,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: true,
                min_binding_size: wgpu::BufferSize::new(kernel.params_size),
            },
            count: None,
        }];
        for (i, access) in kernel.storage.iter().enumerate() {
            entries.push(wgpu::BindGroupLayoutEntry {
                binding: i as u32 + 1,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage {
                        read_only: *access == Access::Read,
                    },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            });
        }
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(kernel.name),
            entries: &entries,
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(kernel.name),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let l = Arc::new(BindLayout {
            id: self.next_layout_id,
            layout,
            pipeline_layout,
            params_size: kernel.params_size,
            storage: kernel.storage,
        });
        self.next_layout_id += 1;
        self.layouts.insert(key, l.clone());
        l
    }

    /// Compiles every variant in `all_variants`, so the products and ops they cover compile
    /// nothing when first recorded. The cooperative-matrix matmuls are not among them: their
    /// variants (tile, types, operand access, epilogue) number over a thousand, and a step
    /// compiles the few it uses on first use.
    pub fn warmup(&mut self, device: &wgpu::Device, f16: bool) {
        let queued: Vec<_> = all_variants(f16)
            .into_iter()
            .map(|(kernel, spec)| self.get(device, kernel, &spec))
            .collect();
        for p in queued {
            p.compute();
        }
    }
}

/// Makes one variant's pipeline: the composed WGSL through naga, then the driver.
fn compile(
    device: &wgpu::Device,
    kernel: &'static KernelDesc,
    spec: &Spec,
    layout: &BindLayout,
    subgroups: bool,
    checked: bool,
) -> wgpu::ComputePipeline {
    let source = compose_source(kernel.family, spec, subgroups);
    let desc = wgpu::ShaderModuleDescriptor {
        label: Some(kernel.name),
        source: wgpu::ShaderSource::Wgsl(source.into()),
    };
    let module = if checked {
        device.create_shader_module(desc)
    } else {
        // SAFETY: every kernel bounds-checks its own indices against its params (element
        // counts, shapes, tile edges; tested at odd sizes with poisoned outputs), so naga's
        // per-access clamping is redundant work in the inner loops.
        unsafe { device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
    };
    device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(kernel.name),
        layout: Some(&layout.pipeline_layout),
        module: &module,
        entry_point: Some(kernel.name),
        compilation_options: wgpu::PipelineCompilationOptions {
            constants: &[],
            // Every kernel writes its workgroup memory before reading it.
            zero_initialize_workgroup_memory: false,
        },
        cache: None,
    })
}

/// Every (kernel, specialization) the engine dispatches but the cooperative-matrix matmuls
/// (`matmul_coop::variants`, for adapters that have them): compiled by `warmup`, translated to
/// MSL and HLSL by the portability test.
pub fn all_variants(f16: bool) -> Vec<(&'static KernelDesc, Spec)> {
    let mut v = Vec::new();
    v.extend(elementwise::variants(f16));
    v.extend(reduce::variants(f16));
    v.extend(softmax::variants());
    v.extend(matmul::variants(f16));
    v.extend(gather::variants());
    v.extend(scatter::variants());
    v.extend(adamw::variants(f16));
    v.extend(loss_scale::variants());
    v.extend(cast::variants(f16));
    v.extend(random::variants());
    v.extend(layernorm::variants(f16));
    v.extend(rmsnorm::variants(f16));
    v.extend(swiglu::variants(f16));
    v.extend(cross_entropy::variants(f16));
    v.extend(attention::variants());
    #[cfg(feature = "lab")]
    v.extend(peak::variants());
    v.push((&absmax::ABSMAX, absmax::spec()));
    v.push((&count_nonfinite::COUNT_NONFINITE, count_nonfinite::spec()));
    v
}

/// Workgroups `[x, y, 1]` covering `groups` linear workgroups; kernels read their linear index
/// as `wid.y * nwg.x + wid.x` and skip past the end (the per-dimension limit is 65,535 on most
/// adapters).
pub fn grid(groups: u64, max_per_dim: u32) -> [u32; 3] {
    let max = max_per_dim as u64;
    if groups <= max {
        return [groups as u32, 1, 1];
    }
    let y = groups.div_ceil(max);
    let x = groups.div_ceil(y);
    [x as u32, y as u32, 1]
}

/// Packs up to 8 dims (shape or strides) as two `vec4<u32>`, the uniform layout WGSL needs
/// for an array.
pub fn pack8(values: &[usize]) -> [u32; 8] {
    let mut out = [0u32; 8];
    for (o, v) in out.iter_mut().zip(values) {
        *o = *v as u32;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{Spec, SpecValue};
    use std::hash::BuildHasher;

    fn hash(s: &Spec) -> u64 {
        rustc_hash::FxBuildHasher.hash_one(s)
    }

    #[test]
    fn specs_built_alike_are_one_key_and_any_difference_another() {
        const WIDE: &str = "vec4<f32>";
        let spec = |tile: u32, acc: bool, ty: &'static str| {
            Spec::new().u32("TILE", tile).bool("ACC", acc).ty("V", ty)
        };
        let a = spec(64, true, WIDE);
        assert!(a == spec(64, true, WIDE));
        assert_eq!(hash(&a), hash(&spec(64, true, WIDE)));
        for other in [
            spec(32, true, WIDE),
            spec(64, false, WIDE),
            spec(64, true, "f32"),
            spec(64, true, WIDE).u32("EXTRA", 0),
        ] {
            assert!(a != other, "{} against {}", a.describe(), other.describe());
        }
        // A type text is its address: a copy of the text elsewhere is another key (a second,
        // equal pipeline), never a wrong one.
        let copy: &'static str = Box::leak(WIDE.to_string().into_boxed_str());
        assert!(a != spec(64, true, copy));
        assert!(matches!(a.0[2].1, SpecValue::Type(t) if t == copy));
    }
}
