//! Tile tables measured by the project, compiled into the binary (`tiles/` in the repository):
//! a run on an adapter with no table of its own takes the shipped table of its adapter and
//! driver, else of the nearest driver of the same adapter.

/// A table compiled in: its file name under `tiles/` and its text.
#[derive(Clone, Copy, Debug)]
pub struct Shipped {
    pub file: &'static str,
    pub json: &'static str,
}

/// Every table under `tiles/` (a test checks the list against the directory).
pub const SHIPPED: &[Shipped] = &[Shipped {
    file: "matmul-tiles-NVIDIA-H100-80GB-HBM3-580.159.04.json",
    json: include_str!("../../../tiles/matmul-tiles-NVIDIA-H100-80GB-HBM3-580.159.04.json"),
}];

/// The shipped table for `adapter` with `driver`, if any (its driver and whether it is exactly
/// `driver`): the exact driver's, else the nearest measured driver's of the same adapter
/// (`driver_distance`). `tables` is (adapter, driver, index) per shipped table.
pub fn nearest_shipped(
    tables: &[(String, String, usize)],
    adapter: &str,
    driver: &str,
) -> Option<(usize, bool)> {
    tables
        .iter()
        .filter(|(a, _, _)| a == adapter)
        .min_by_key(|(_, d, _)| driver_distance(d, driver))
        .map(|(_, d, i)| (*i, d == driver))
}

/// How far driver version `a` is from `b` (`580.159.04` against `580.126.09`), as (how early
/// the first number they differ in comes, by how much it differs): the same version is (0, 0),
/// a later first difference is nearer; texts that are not versions are farthest.
fn driver_distance(a: &str, b: &str) -> (usize, u64) {
    let nums =
        |s: &str| -> Option<Vec<u64>> { s.split('.').map(|p| p.trim().parse().ok()).collect() };
    let (Some(x), Some(y)) = (nums(a), nums(b)) else {
        return (usize::MAX, u64::MAX);
    };
    let n = x.len().max(y.len());
    let at = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
    match (0..n).find(|&i| at(&x, i) != at(&y, i)) {
        None => (0, 0),
        Some(i) => (n - i, at(&x, i).abs_diff(at(&y, i))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exact_driver_wins_then_the_nearest_version_of_the_same_adapter() {
        let t = |a: &str, d: &str, i| (a.to_string(), d.to_string(), i);
        let tables = [
            t("GPU A", "580.159.04", 0),
            t("GPU A", "580.126.09", 1),
            t("GPU A", "570.200.01", 2),
            t("GPU B", "580.159.04", 3),
        ];
        assert_eq!(
            nearest_shipped(&tables, "GPU A", "580.159.04"),
            Some((0, true))
        );
        assert_eq!(
            nearest_shipped(&tables, "GPU A", "580.130.00"),
            Some((1, false))
        );
        assert_eq!(
            nearest_shipped(&tables, "GPU A", "572.1.1"),
            Some((2, false))
        );
        assert_eq!(
            nearest_shipped(&tables, "GPU A", "590.1.1"),
            Some((0, false))
        );
        assert_eq!(nearest_shipped(&tables, "GPU C", "580.159.04"), None);
        assert_eq!(
            nearest_shipped(&tables, "GPU B", "Mesa 23"),
            Some((3, false))
        );
    }

    #[test]
    fn every_file_under_tiles_is_shipped() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tiles");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .expect("tiles/")
            .map(|e| {
                e.expect("an entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .filter(|f| f.ends_with(".json"))
            .collect();
        files.sort();
        let mut listed: Vec<String> = SHIPPED.iter().map(|t| t.file.to_string()).collect();
        listed.sort();
        assert_eq!(files, listed, "tiles/*.json against SHIPPED");
    }

    #[test]
    fn every_shipped_table_parses_and_names_its_file() {
        for t in SHIPPED {
            let (adapter, driver, table) =
                crate::kernels::tuning::TileTable::parse(t.json).expect(t.file);
            assert!(!table.is_empty(), "{}", t.file);
            assert_eq!(
                t.file,
                crate::kernels::tuning::table_file_name(&adapter, &driver)
            );
        }
    }
}
