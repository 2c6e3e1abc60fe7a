//! What the Vulkan driver's compiler made of the matmul kernels: registers per lane, spills,
//! shared memory, as the driver reports them through VK_KHR_pipeline_executable_properties
//! (wgpu does not expose it, so this opens its own Vulkan device). A measuring aid for tile
//! choices, not part of the engine.
//!
//! ```sh
//! cargo run --release --features lab --example shader_stats -- coop:2x2/4x4/32 coop:2x4/4x2/64 tiled:128x64x16/8x4
//! ```
//!
//! Each argument names a kernel variant as `wgrad wgsl` takes it (`coop:TILE[:ENTRY[:vec]]`,
//! `tiled:TILE[:ENTRY[:v4]]`, `attn:fwd|bwd:IN[:GRAD[:OUT]]`: `wgrad::kernels::named`). A `lab`
//! build's tool (`cargo run --release --features lab --example shader_stats -- ...`). The
//! SPIR-V is written by
//! naga with the options wgpu uses for the engine's shader modules (no bounds checks, no loop
//! bounding, no division checks). `--no-robust` opens the device without robustBufferAccess /
//! robustBufferAccess2 (wgpu turns both on where offered), to see what the driver's bounds checks
//! cost in registers.

use std::ffi::{c_char, CStr};

use ash::vk;
use wgrad::kernels::{compose_source, named, Family, Spec};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let robust = !args.iter().any(|a| a == "--no-robust");
    // `--ir DIR`: also the driver's internal representations (where it gives any), one file each.
    let ir = args
        .iter()
        .position(|a| a == "--ir")
        .map(|i| std::path::PathBuf::from(args.get(i + 1).expect("--ir DIR")));
    let kernels: Vec<(String, &'static Family, &'static str, Spec)> = args
        .iter()
        .filter(|a| a.contains(':'))
        .map(|a| kernel(a))
        .collect();
    if kernels.is_empty() {
        eprintln!("usage: shader_stats [--no-robust] coop:2x2/4x4/32 tiled:128x64x16/8x4 ...");
        std::process::exit(2);
    }
    // SAFETY: plain Vulkan calls on objects created here and destroyed before returning.
    unsafe { run(&kernels, robust, ir.as_deref()) }
}

fn kernel(arg: &str) -> (String, &'static Family, &'static str, Spec) {
    let n = named::parse(arg).unwrap_or_else(|e| panic!("{e}"));
    (n.name, n.family, n.entry, n.spec)
}

fn spirv(family: &Family, spec: &Spec, entry: &str) -> (Vec<u32>, Vec<(u32, vk::DescriptorType)>) {
    let src = compose_source(family, spec, true);
    let module = naga::front::wgsl::parse_str(&src)
        .unwrap_or_else(|e| panic!("{entry}: {}", e.emit_to_string(&src)));
    let caps = naga::valid::Capabilities::all();
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
        .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
        .subgroup_operations(naga::valid::SubgroupOperationSet::all())
        .validate(&module)
        .unwrap_or_else(|e| panic!("{entry}: {}", e.emit_to_string(&src)));
    let unchecked = naga::proc::BoundsCheckPolicy::Unchecked;
    let options = naga::back::spv::Options {
        lang_version: (1, 3),
        flags: naga::back::spv::WriterFlags::empty(),
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: unchecked,
            buffer: unchecked,
            image_load: unchecked,
            binding_array: unchecked,
        },
        zero_initialize_workgroup_memory:
            naga::back::spv::ZeroInitializeWorkgroupMemoryMode::Native,
        force_loop_bounding: false,
        emit_int_div_checks: false,
        ..Default::default()
    };
    let pipeline = naga::back::spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: entry.to_string(),
    };
    let words = naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline))
        .unwrap_or_else(|e| panic!("{entry}: SPIR-V: {e:?}"));
    let mut bindings = Vec::new();
    for (_, var) in module.global_variables.iter() {
        let Some(rb) = &var.binding else { continue };
        let ty = match var.space {
            naga::AddressSpace::Uniform => vk::DescriptorType::UNIFORM_BUFFER,
            naga::AddressSpace::Storage { .. } => vk::DescriptorType::STORAGE_BUFFER,
            _ => continue,
        };
        assert_eq!(rb.group, 0, "{entry}: one bind group expected");
        bindings.push((rb.binding, ty));
    }
    (words, bindings)
}

fn name(chars: &[c_char]) -> String {
    // SAFETY: Vulkan fills these arrays with NUL-terminated strings.
    unsafe { CStr::from_ptr(chars.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

unsafe fn run(
    kernels: &[(String, &'static Family, &'static str, Spec)],
    robust: bool,
    ir: Option<&std::path::Path>,
) {
    let entry = ash::Entry::load().expect("no Vulkan loader");
    let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_3);
    let instance = entry
        .create_instance(
            &vk::InstanceCreateInfo::default().application_info(&app),
            None,
        )
        .expect("vkCreateInstance");
    let pd = *instance
        .enumerate_physical_devices()
        .expect("physical devices")
        .first()
        .expect("no Vulkan device");
    let props = instance.get_physical_device_properties(pd);
    println!(
        "device: {} (driver {:#x}), robust buffer access {}",
        name(&props.device_name),
        props.driver_version,
        if robust {
            "on where offered (as wgpu)"
        } else {
            "off"
        }
    );
    let offered: Vec<String> = instance
        .enumerate_device_extension_properties(pd)
        .expect("device extensions")
        .iter()
        .map(|e| name(&e.extension_name))
        .collect();
    let has = |n: &CStr| offered.iter().any(|o| o.as_bytes() == n.to_bytes());
    // Without the extension the pipelines are still compiled (the SPIR-V is checked), with no
    // statistics to print.
    let stats = has(ash::khr::pipeline_executable_properties::NAME);
    if !stats {
        println!("the driver does not offer VK_KHR_pipeline_executable_properties: no statistics");
    }
    let mut extensions = Vec::new();
    if stats {
        extensions.push(ash::khr::pipeline_executable_properties::NAME.as_ptr());
    }
    let coop = has(ash::khr::cooperative_matrix::NAME);
    if coop {
        extensions.push(ash::khr::cooperative_matrix::NAME.as_ptr());
    }
    let robust2 = has(ash::ext::robustness2::NAME);
    if robust && robust2 {
        extensions.push(ash::ext::robustness2::NAME.as_ptr());
    }

    // Every feature the device offers, robustness as asked.
    let mut f11 = vk::PhysicalDeviceVulkan11Features::default();
    let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
    let mut f13 = vk::PhysicalDeviceVulkan13Features::default();
    let mut fcoop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
    let mut fpep = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
    let mut frob2 = vk::PhysicalDeviceRobustness2FeaturesEXT::default();
    let mut core = {
        let mut query = vk::PhysicalDeviceFeatures2::default()
            .push_next(&mut f11)
            .push_next(&mut f12)
            .push_next(&mut f13)
            .push_next(&mut fpep)
            .push_next(&mut fcoop)
            .push_next(&mut frob2);
        instance.get_physical_device_features2(pd, &mut query);
        query.features
    };
    if !robust {
        core.robust_buffer_access = vk::FALSE;
    }
    f13.robust_image_access = vk::FALSE;
    frob2.robust_image_access2 = vk::FALSE;
    frob2.null_descriptor = vk::FALSE;
    for next in [
        &mut f11.p_next,
        &mut f12.p_next,
        &mut f13.p_next,
        &mut fpep.p_next,
        &mut fcoop.p_next,
        &mut frob2.p_next,
    ] {
        *next = std::ptr::null_mut();
    }
    let mut features = vk::PhysicalDeviceFeatures2::default()
        .features(core)
        .push_next(&mut f11)
        .push_next(&mut f12)
        .push_next(&mut f13);
    if stats {
        features = features.push_next(&mut fpep);
    }
    if coop {
        features = features.push_next(&mut fcoop);
    }
    if robust && robust2 {
        features = features.push_next(&mut frob2);
    }
    let family = instance
        .get_physical_device_queue_family_properties(pd)
        .iter()
        .position(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE))
        .expect("no compute queue") as u32;
    let priorities = [1.0f32];
    let queues = [vk::DeviceQueueCreateInfo::default()
        .queue_family_index(family)
        .queue_priorities(&priorities)];
    let info = vk::DeviceCreateInfo::default()
        .queue_create_infos(&queues)
        .enabled_extension_names(&extensions)
        .push_next(&mut features);
    let device = instance
        .create_device(pd, &info, None)
        .expect("vkCreateDevice");
    let pep = ash::khr::pipeline_executable_properties::Device::new(&instance, &device);

    for (label, family, entry_point, spec) in kernels {
        let (words, bindings) = spirv(family, spec, entry_point);
        let module = device
            .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None)
            .expect("vkCreateShaderModule");
        let layout_bindings: Vec<_> = bindings
            .iter()
            .map(|&(b, ty)| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b)
                    .descriptor_type(ty)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        let set_layout = device
            .create_descriptor_set_layout(
                &vk::DescriptorSetLayoutCreateInfo::default().bindings(&layout_bindings),
                None,
            )
            .expect("vkCreateDescriptorSetLayout");
        let set_layouts = [set_layout];
        let layout = device
            .create_pipeline_layout(
                &vk::PipelineLayoutCreateInfo::default().set_layouts(&set_layouts),
                None,
            )
            .expect("vkCreatePipelineLayout");
        let cname = std::ffi::CString::new(*entry_point).unwrap();
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(module)
            .name(&cname);
        let create = [vk::ComputePipelineCreateInfo::default()
            .stage(stage)
            .layout(layout)
            .flags(if stats && ir.is_some() {
                vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
                    | vk::PipelineCreateFlags::CAPTURE_INTERNAL_REPRESENTATIONS_KHR
            } else if stats {
                vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
            } else {
                vk::PipelineCreateFlags::empty()
            })];
        let pipeline = device
            .create_compute_pipelines(vk::PipelineCache::null(), &create, None)
            .map_err(|(_, e)| e)
            .expect("vkCreateComputePipelines")[0];
        if !stats {
            println!("{label}: compiled");
        }
        let executables = if !stats {
            Vec::new()
        } else {
            pep.get_pipeline_executable_properties(
                &vk::PipelineInfoKHR::default().pipeline(pipeline),
            )
            .expect("vkGetPipelineExecutablePropertiesKHR")
        };
        for (i, exe) in executables.iter().enumerate() {
            let stats = pep
                .get_pipeline_executable_statistics(
                    &vk::PipelineExecutableInfoKHR::default()
                        .pipeline(pipeline)
                        .executable_index(i as u32),
                )
                .expect("vkGetPipelineExecutableStatisticsKHR");
            let cells: Vec<String> = stats
                .iter()
                .map(|s| {
                    let v = match s.format {
                        vk::PipelineExecutableStatisticFormatKHR::BOOL32 => s.value.b32.to_string(),
                        vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64.to_string(),
                        // NVIDIA's "Local Memory Size" (spilled bytes per lane) comes with
                        // bit 36 set (2^36 for none, 2^36 + 128 for 128 bytes): masked.
                        vk::PipelineExecutableStatisticFormatKHR::UINT64 => {
                            let v = s.value.u64;
                            if v >= 1 << 36 {
                                (v & ((1 << 36) - 1)).to_string()
                            } else {
                                v.to_string()
                            }
                        }
                        vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => {
                            s.value.f64.to_string()
                        }
                        _ => "?".into(),
                    };
                    format!("{} {v}", name(&s.name))
                })
                .collect();
            println!(
                "{label} [{}, subgroup {}]: {}",
                name(&exe.name),
                exe.subgroup_size,
                cells.join(", ")
            );
            if let Some(dir) = ir {
                internal_representations(&pep, pipeline, i as u32, dir, label);
            }
        }
        device.destroy_pipeline(pipeline, None);
        device.destroy_pipeline_layout(layout, None);
        device.destroy_descriptor_set_layout(set_layout, None);
        device.destroy_shader_module(module, None);
    }
    device.destroy_device(None);
    instance.destroy_instance(None);
}

/// Writes executable `index`'s internal representations (text ones as text) to `dir`.
unsafe fn internal_representations(
    pep: &ash::khr::pipeline_executable_properties::Device,
    pipeline: vk::Pipeline,
    index: u32,
    dir: &std::path::Path,
    label: &str,
) {
    let info = vk::PipelineExecutableInfoKHR::default()
        .pipeline(pipeline)
        .executable_index(index);
    // First call: how many and how large; second: the data into buffers of those sizes.
    let mut reprs = pep
        .get_pipeline_executable_internal_representations(&info)
        .expect("vkGetPipelineExecutableInternalRepresentationsKHR");
    let mut buffers: Vec<Vec<u8>> = reprs.iter().map(|r| vec![0u8; r.data_size]).collect();
    for (r, b) in reprs.iter_mut().zip(&mut buffers) {
        r.p_data = b.as_mut_ptr().cast();
    }
    let mut count = reprs.len() as u32;
    let fp = pep
        .fp()
        .get_pipeline_executable_internal_representations_khr;
    let result = fp(pep.device(), &info, &mut count, reprs.as_mut_ptr());
    if result != vk::Result::SUCCESS {
        println!("  internal representations: {result:?}");
        return;
    }
    std::fs::create_dir_all(dir).expect("create the --ir folder");
    let stem: String = label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    for (r, b) in reprs.iter().zip(&buffers) {
        let what = name(&r.name);
        let file = dir.join(format!("{stem}.{index}.{}.txt", what.replace(' ', "_")));
        let bytes = if r.is_text == vk::TRUE {
            &b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())]
        } else {
            &b[..]
        };
        std::fs::write(&file, bytes).expect("write an internal representation");
        println!("  {what}: {} bytes -> {}", r.data_size, file.display());
    }
}
