//! `wgrad info`: what the adapter is and can do.

use wgrad::Device;

pub fn run(json: bool) -> wgrad::Result<()> {
    let device = Device::new()?;
    let r = device.report();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&r).expect("the report serializes")
        );
        return Ok(());
    }
    println!("adapter   {}", r.adapter);
    println!("backend   {}  ({})", r.backend, r.device_type);
    println!("driver    {} {}", r.driver, r.driver_info);
    println!(
        "features  {}",
        if r.features.is_empty() {
            "(none of the optional ones)".into()
        } else {
            r.features.join(", ")
        }
    );
    println!("limits");
    let l = &r.limits;
    let rows: [(&str, u64); 10] = [
        (
            "max_storage_buffer_binding_size",
            l.max_storage_buffer_binding_size,
        ),
        ("max_buffer_size", l.max_buffer_size),
        (
            "max_storage_buffers_per_shader_stage",
            l.max_storage_buffers_per_shader_stage.into(),
        ),
        (
            "max_compute_workgroup_storage_size",
            l.max_compute_workgroup_storage_size.into(),
        ),
        (
            "max_compute_invocations_per_workgroup",
            l.max_compute_invocations_per_workgroup.into(),
        ),
        (
            "max_compute_workgroups_per_dimension",
            l.max_compute_workgroups_per_dimension.into(),
        ),
        ("max_immediate_size", l.max_immediate_size.into()),
        (
            "min_uniform_buffer_offset_alignment",
            l.min_uniform_buffer_offset_alignment.into(),
        ),
        ("min_subgroup_size", l.min_subgroup_size.into()),
        ("max_subgroup_size", l.max_subgroup_size.into()),
    ];
    for (name, v) in rows {
        println!("  {name:<40} {v}");
    }
    if r.cooperative_matrix.is_empty() {
        println!("cooperative matrix: none (matmuls use the tiled WGSL kernels)");
    } else {
        println!("cooperative matrix (M x N x K, operands -> accumulator):");
        for c in &r.cooperative_matrix {
            println!("  {}x{}x{}  {} -> {}", c.m, c.n, c.k, c.ab, c.cr);
        }
    }
    Ok(())
}
