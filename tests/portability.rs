//! Every kernel variant the engine dispatches, validated by naga and translated to Metal (MSL),
//! DX12 (HLSL) and Vulkan (SPIR-V), so breakage on a backend CI cannot run shows here. Also
//! checks that each `#[repr(C)]` params struct has the size of its WGSL mirror.

use naga::valid::{Capabilities, ValidationFlags, Validator};
use wgrad::kernels::{all_variants, compose_source, KernelDesc, Spec};

fn parse(
    kernel: &KernelDesc,
    spec: &Spec,
    subgroups: bool,
) -> (naga::Module, naga::valid::ModuleInfo) {
    let src = compose_source(kernel.family, spec, subgroups);
    let module = naga::front::wgsl::parse_str(&src).unwrap_or_else(|e| {
        panic!(
            "{} [{}] (subgroups {subgroups}) does not parse:\n{}",
            kernel.name,
            spec.describe(),
            e.emit_to_string(&src)
        )
    });
    let caps = if subgroups {
        Capabilities::SUBGROUP | Capabilities::SHADER_FLOAT16
    } else {
        Capabilities::SHADER_FLOAT16
    };
    let info = Validator::new(ValidationFlags::all(), caps)
        .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
        .subgroup_operations(naga::valid::SubgroupOperationSet::all())
        .validate(&module)
        .unwrap_or_else(|e| {
            panic!(
                "{} [{}] (subgroups {subgroups}) fails validation:\n{}",
                kernel.name,
                spec.describe(),
                e.emit_to_string(&src)
            )
        });
    (module, info)
}

/// Fails unless `kernel`'s entry point uses only the bindings its descriptor lays out: the
/// params at 0 and its storage buffers at 1.. (a pipeline's layout has those and no others).
fn check_bindings(
    kernel: &KernelDesc,
    module: &naga::Module,
    info: &naga::valid::ModuleInfo,
    what: &str,
) {
    let ep = module
        .entry_points
        .iter()
        .position(|e| e.name == kernel.name)
        .unwrap_or_else(|| panic!("{what}: no entry point {}", kernel.name));
    for (handle, var) in module.global_variables.iter() {
        let Some(rb) = &var.binding else { continue };
        if info.get_entry_point(ep)[handle].is_empty() {
            continue;
        }
        assert!(
            rb.group == 0 && rb.binding as usize <= kernel.storage.len(),
            "{what}: uses binding {} ({:?}), but the kernel lays out params and {} storage buffers",
            rb.binding,
            var.name,
            kernel.storage.len()
        );
    }
}

#[test]
fn every_variant_translates_to_msl_hlsl_and_spirv() {
    let variants = all_variants(true);
    let families: std::collections::BTreeSet<_> =
        variants.iter().map(|(k, _)| k.family.name).collect();
    for family in [
        "elementwise",
        "reduce",
        "softmax",
        "matmul",
        "gather",
        "random",
        "layernorm",
        "rmsnorm",
        "swiglu",
    ] {
        assert!(
            families.contains(family),
            "no variant of the {family} family is listed"
        );
    }
    for (kernel, spec) in &variants {
        for subgroups in [true, false] {
            if !kernel.family.workgroup_reduce && !subgroups {
                continue; // identical source
            }
            let (module, info) = parse(kernel, spec, subgroups);
            let what = format!(
                "{} [{}] (subgroups {subgroups})",
                kernel.name,
                spec.describe()
            );
            check_bindings(kernel, &module, &info, &what);
            let entry = Some((naga::ShaderStage::Compute, kernel.name.to_string()));

            let msl_options = naga::back::msl::Options {
                lang_version: (2, 4),
                ..Default::default()
            };
            let msl_pipeline = naga::back::msl::PipelineOptions {
                entry_point: entry.clone(),
                ..Default::default()
            };
            naga::back::msl::write_string(&module, &info, &msl_options, &msl_pipeline)
                .unwrap_or_else(|e| panic!("{what}: MSL: {e:?}"));

            let hlsl_options = naga::back::hlsl::Options {
                shader_model: naga::back::hlsl::ShaderModel::V6_2,
                ..Default::default()
            };
            let hlsl_pipeline = naga::back::hlsl::PipelineOptions {
                entry_point: entry.clone(),
            };
            let mut hlsl = String::new();
            naga::back::hlsl::Writer::new(&mut hlsl, &hlsl_options, &hlsl_pipeline)
                .write(&module, &info, None)
                .unwrap_or_else(|e| panic!("{what}: HLSL: {e:?}"));

            let spv_pipeline = naga::back::spv::PipelineOptions {
                shader_stage: naga::ShaderStage::Compute,
                entry_point: kernel.name.to_string(),
            };
            naga::back::spv::write_vec(&module, &info, &Default::default(), Some(&spv_pipeline))
                .unwrap_or_else(|e| panic!("{what}: SPIR-V: {e:?}"));
        }
    }
}

#[test]
fn params_structs_match_their_wgsl_mirrors() {
    let mut checked = std::collections::HashSet::new();
    for (kernel, spec) in all_variants(true) {
        if !checked.insert(kernel.name) {
            continue;
        }
        let (module, _) = parse(kernel, &spec, true);
        let span = module
            .types
            .iter()
            .find_map(|(_, ty)| match (&ty.name, &ty.inner) {
                (Some(name), naga::TypeInner::Struct { span, .. }) if name == "Params" => {
                    Some(*span)
                }
                _ => None,
            })
            .unwrap_or_else(|| panic!("{}: no `struct Params` in its WGSL", kernel.name));
        assert_eq!(
            span as u64, kernel.params_size,
            "{}: WGSL Params is {span} bytes, the Rust params struct {}",
            kernel.name, kernel.params_size
        );
        assert_eq!(
            kernel.params_size % 16,
            0,
            "{}: uniform structs are 16-byte multiples",
            kernel.name
        );
    }
}

/// Every cooperative-matrix kernel variant (NVIDIA's 16x16 and Apple's 8x8 fragments) passes
/// naga's validation and translates to SPIR-V (and Apple's to MSL). lavapipe has no cooperative matrices,
/// so this is what CI checks of them; they run on a GPU machine (see PROFILING.md).
#[test]
fn every_cooperative_matrix_variant_translates_to_spirv_and_msl() {
    use wgrad::kernels::attention_coop;
    use wgrad::kernels::matmul_coop::{variants, Coop};
    let caps = Capabilities::SUBGROUP
        | Capabilities::SHADER_FLOAT16
        | Capabilities::SHADER_FLOAT16_IN_FLOAT32
        | Capabilities::COOPERATIVE_MATRIX
        | Capabilities::SUBGROUP_BARRIER;
    let mut count = 0;
    // (adapter, its workgroup memory, whether its variants must translate to MSL: the NVIDIA
    // variants load fragments from vec4<f16> tiles, which only Vulkan's loads allow)
    for (coop, wg_bytes, msl) in [(Coop::NVIDIA, 49152, false), (Coop::APPLE, 32768, true)] {
        let mut all = variants(coop, wg_bytes);
        all.extend(attention_coop::variants(coop, wg_bytes));
        #[cfg(feature = "lab")]
        all.extend(wgrad::kernels::peak::coop_variants(coop));
        for (kernel, spec) in all {
            let what = format!("{} [{}]", kernel.name, spec.describe());
            let src = compose_source(kernel.family, &spec, true);
            let module = naga::front::wgsl::parse_str(&src)
                .unwrap_or_else(|e| panic!("{what} does not parse:\n{}", e.emit_to_string(&src)));
            let info = Validator::new(ValidationFlags::all(), caps)
                .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
                .subgroup_operations(naga::valid::SubgroupOperationSet::all())
                .validate(&module)
                .unwrap_or_else(|e| panic!("{what} fails validation:\n{}", e.emit_to_string(&src)));
            check_bindings(kernel, &module, &info, &what);
            let spv_pipeline = naga::back::spv::PipelineOptions {
                shader_stage: naga::ShaderStage::Compute,
                entry_point: kernel.name.to_string(),
            };
            let spv_options = naga::back::spv::Options {
                lang_version: (1, 6),
                ..Default::default()
            };
            naga::back::spv::write_vec(&module, &info, &spv_options, Some(&spv_pipeline))
                .unwrap_or_else(|e| panic!("{what}: SPIR-V: {e:?}"));
            count += 1;
            if !msl {
                continue;
            }
            let msl_options = naga::back::msl::Options {
                lang_version: (3, 0),
                ..Default::default()
            };
            let msl_pipeline = naga::back::msl::PipelineOptions {
                entry_point: Some((naga::ShaderStage::Compute, kernel.name.to_string())),
                ..Default::default()
            };
            naga::back::msl::write_string(&module, &info, &msl_options, &msl_pipeline)
                .unwrap_or_else(|e| panic!("{what}: MSL: {e:?}"));
        }
    }
    assert_eq!(
        count,
        2 * (4 * (2 * 4 * (6 * 6 + 4 * 4 + 3 * 4 * 6) + (6 * 6 + 4 * 4 + 2 * 4 * 6))
            + 4 * (2 * 2 * (6 + 4 * 4) + 3 * (6 + 3 * 4))
            + 2 * 3 * (3 + 5 * 2)
            + 3
            + if cfg!(feature = "lab") { 2 } else { 0 }
            + 4 * (2 * 4 * 4 + 4))
            + 4 * (2 * 5 * (6 + 4 * 4) + 2 * (6 + 3 * 4))
            + 4 * (2 * 4 * (4 + 1) + 2 * 4),
        "variants: 2 fragment sizes x (matmul: 4 tiles x (acc x 4 epilogues (plain, bias, bias + \
         GELU, and bias + GELU with an f16 `pre`), and bias + residual not accumulating into an f32 C: the accesses of the 4 type \
         sets with an f32 C) x the operand \
         accesses of the 5 type sets (6 ways to read an f16 operand, 4 an f32 one: f16 x f16, \
         f32 x f32, and three with one of each), and \
         split products summed in their dispatch: 4 tiles x the paired accesses of the 5 type sets \
         x (acc x plain and bias, and with an f32 C acc x column sums and the residual not \
         accumulating); \
         attention: without and with a rotary embedding x 3 head dims x (the forward of 3 type \
         sets, and the backward adding into its outputs or not of 5: `Io::made`), and its D of 3 \
         type sets; in a lab build 2 roofs; X3 (f32 operands as high and low f16 parts): 4 tiles x (acc x the 4 \
         paired accesses of f32 operands x (3 epilogues and column sums), and the residual not \
         accumulating)); and on 16 x 16 fragments, C stored in vectors through the scratch tile: \
         4 tiles x (acc x (3 epilogues, and GELU with `pre` in vectors of f32 or f16) x the paired accesses of \
         the 5 type sets, and the residual not accumulating, `pre` in vectors or not, x those of \
         the 4 with an f32 C), and the X3 variants: 4 tiles x (acc x the 4 paired accesses x (3 \
         epilogues, column sums and GELU with `pre` in vectors), and the residual not \
         accumulating, `pre` in vectors or not)"
    );
}

/// The cooperative-matrix attention's `Tile::workgroup_bytes` (what picks its blocking, and
/// decides how many workgroups share a core) is what its WGSL declares, for every pass, head
/// dim and adapter.
#[test]
fn cooperative_attention_workgroup_bytes_match_the_wgsl() {
    use wgrad::kernels::attention::{Pass, HEAD_DIMS};
    use wgrad::kernels::attention_coop::{kernel, spec, tile, Io};
    use wgrad::kernels::matmul_coop::Coop;
    for (coop, limit) in [(Coop::NVIDIA, 49152), (Coop::APPLE, 32768)] {
        for dmax in HEAD_DIMS {
            for pass in [Pass::Forward, Pass::Dq, Pass::Dkv] {
                let t = tile(pass, dmax, coop, limit).expect("a tile fits");
                // The types change no workgroup array.
                let src = compose_source(
                    kernel(pass).family,
                    &spec(pass, t, coop, false, false, Io::F32),
                    true,
                );
                let module = naga::front::wgsl::parse_str(&src).expect("parses");
                let declared: u32 = module
                    .global_variables
                    .iter()
                    .filter(|(_, v)| v.space == naga::AddressSpace::WorkGroup)
                    .map(|(_, v)| module.types[v.ty].inner.size(module.to_ctx()))
                    .sum();
                assert_eq!(
                    t.workgroup_bytes(pass, coop),
                    declared,
                    "{pass:?} D {dmax} {t:?} on {coop:?}"
                );
            }
        }
    }
}
