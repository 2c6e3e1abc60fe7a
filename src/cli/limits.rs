//! What the benchmarks share: sizes over an adapter's limits skipped with a line that names the
//! limit (the same command runs on lavapipe and on an H100), and the roofs line.

use wgrad::profile::ceilings::Ceilings;
use wgrad::Result;

/// `r`, or (Ok) the message of the adapter limit it exceeds (`Error::is_adapter_limit`):
/// the caller skips that size and reports the message.
pub fn or_skip<T>(r: Result<T>) -> Result<std::result::Result<T, String>> {
    match r {
        Ok(t) => Ok(Ok(t)),
        Err(e) if e.is_adapter_limit() => Ok(Err(e.to_string())),
        Err(e) => Err(e),
    }
}

/// Prints the skipped sizes, one line each.
pub fn print_skipped(skipped: &[String]) {
    for s in skipped {
        println!("skipped: {s}");
    }
}

/// `roofs: copy ... GB/s, ...`: the compute roofs where measured (a `lab` build's peak
/// kernels), else said to be absent.
pub fn roofs_line(c: &Ceilings) -> String {
    let coop = match (c.coop_tflops, c.coop_shared_tflops) {
        (Some(t), Some(s)) => {
            format!("{t:.1} TFLOP/s ({s:.1} loading fragments from workgroup memory)")
        }
        _ => "none".into(),
    };
    match c.fma_tflops {
        Some(fma) => format!(
            "roofs: copy {:.0} GB/s (read + written), f32 FMA {fma:.3} TFLOP/s, f16 cooperative \
             matrices {coop}",
            c.copy_gbps
        ),
        None => format!(
            "roofs: copy {:.0} GB/s (read + written); compute roofs only in a `--features lab` \
             build",
            c.copy_gbps
        ),
    }
}

/// A share as a percentage, or `-` where there is no roof to share.
pub fn percent(share: Option<f64>) -> String {
    share.map_or("-".into(), |s| format!("{:.1}%", s * 100.0))
}
