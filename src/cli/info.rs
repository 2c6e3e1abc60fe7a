//! `wgrad info`: what the adapter is and can do, the tile table it runs with, and the options
//! in force (each with the variable that sets it, marked where the environment set it).

use serde::Serialize;
use wgrad::config::OptionRow;
use wgrad::device::AdapterReport;
use wgrad::Device;

/// `wgrad info --json`: the adapter's report (its keys at the top level, as before), the tile
/// table and the options.
#[derive(Serialize)]
struct Info {
    #[serde(flatten)]
    adapter: AdapterReport,
    tile_table: String,
    options: Vec<OptionRow>,
}

pub fn run(json: bool) -> wgrad::Result<()> {
    let device = Device::new()?;
    let r = device.report();
    let tile_table = device.tile_source().to_string();
    let options = device.option_rows();
    if json {
        let info = Info {
            adapter: r,
            tile_table,
            options,
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&info).expect("the report serializes")
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
    println!("tile table  {tile_table}");
    println!("options (variable; * where the environment sets it)");
    let mut group = "";
    for o in &options {
        if o.group != group {
            group = o.group;
            println!("  {group}");
        }
        let mark = if o.from_env { "*" } else { " " };
        println!("    {:<28} {:<40} {mark}{}", o.name, o.value, o.variable);
    }
    Ok(())
}
