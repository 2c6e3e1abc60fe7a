//! Matmul tiles measured on this adapter: a table from a product (shape, layout, precision) to
//! the tile that ran it fastest, and for a product that may split K, the number of K ranges
//! (measured, since how many workgroups fill the GPU is not something wgpu tells). `wgrad
//! bench matmul --search` and `wgrad bench step --tune` fill it (see `crate::tune`); it is kept
//! on disk per adapter and driver (`cache_file`), tables measured by the project ship with the
//! engine (`shipped`), and a product the table does not know gets the tile the shape
//! heuristics choose.

mod shipped;

pub use shipped::{nearest_shipped, Shipped, SHIPPED};

use rustc_hash::FxHashMap as HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::matmul::{Tile, TILES};
use super::matmul_coop::CoopTile;

/// A product as the tile choice sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProductKey {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub batch: u32,
    /// Mixed precision: operands rounded to f16 (stored as f16, or f32 under autocast).
    pub half: bool,
    /// Operands stored as f16 (else f32).
    pub a_f16: bool,
    pub b_f16: bool,
    /// A read with M unit-stride (a transposed view); B read with K unit-stride.
    pub a_t: bool,
    pub b_t: bool,
    /// A bias (and GELU) epilogue: the kernel adds the bias, or, split into ranges of K, the
    /// split sum does; either way the work differs from a plain product's, so they tune apart.
    /// (A table written before bias products could split holds no K ranges for them: the
    /// launcher's rule decides.)
    #[serde(default)]
    pub bias: bool,
    /// The GELU epilogue (with `bias`): it stores twice (pre-activation and output), so it
    /// tunes apart from a bias product; such products do not split K.
    #[serde(default)]
    pub gelu: bool,
    /// Every operand's rows (and C's) start on 8 elements (`rows_aligned`), so every kernel
    /// variant that reads or stores rows in vectors can (rows on 4 elements serve some of
    /// them). The LM head's products have 50,257-wide rows, padded in a training step and not
    /// elsewhere, and the two run different variants, so they tune apart; the search times an
    /// aligned key on rows padded to 8, an unaligned one on rows as long as their extents.
    /// (Missing in a table file written before the field: aligned.)
    #[serde(default = "aligned_by_default")]
    pub aligned: bool,
    /// The tiled kernel's residual epilogue (with `bias`): one more load an element, and an
    /// entry point of its own, which the driver may compile apart from the bias one (an H100
    /// ran the 8 x 512 f32 step's residual products on 64x128x8/8x8v at 6.4 ms each against
    /// 0.4 on 128x64x8/8x4v, 2026-11-25: that tile's residual entry point spilled, its bias
    /// one did not), so it tunes apart. A table without residual entries serves them with
    /// their bias entries (`TileTable::get`). Set for X3 products too (f32 on cooperative
    /// matrices: they run the residual epilogue); never for the mixed-precision
    /// cooperative-matrix products, which run some residual products as bias products.
    /// (Missing in a table file written before the field: none.)
    #[serde(default)]
    pub residual: bool,
}

fn aligned_by_default() -> bool {
    true
}

/// Whether a view's rows start on 8 elements: its offset and every stride other than 1 (of a
/// dim longer than 1) are multiples of 8.
pub fn rows_aligned(offset: usize, shape: &[usize], strides: &[usize]) -> bool {
    offset.is_multiple_of(8)
        && shape
            .iter()
            .zip(strides)
            .all(|(&n, &s)| n <= 1 || s <= 1 || s.is_multiple_of(8))
}

/// `aligned` for A (batch, M, K), B (batch, K, N) and C (batch, M, N) in their natural layouts:
/// contiguous, transposed views where `a_t` / `b_t` say so (what `bench matmul` multiplies).
pub fn natural_rows_aligned(
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    a_t: bool,
    b_t: bool,
) -> bool {
    let view = |rows: usize, cols: usize, t: bool| {
        let (outer, inner) = if t { (cols, rows) } else { (rows, cols) };
        rows_aligned(0, &[batch, outer, inner], &[outer * inner, inner, 1])
    };
    view(m, k, a_t) && view(k, n, b_t) && view(m, n, false)
}

impl ProductKey {
    /// `4096x50257x768 f16 A^T` style: M x N x K, batch, storage, layout.
    pub fn describe(&self) -> String {
        let ty = |f16| if f16 { "f16" } else { "f32" };
        let mut s = format!("{}x{}x{}", self.m, self.n, self.k);
        if self.batch > 1 {
            s += &format!(" (x{})", self.batch);
        }
        s += &format!(" {}·{}", ty(self.a_f16), ty(self.b_f16));
        if self.half && !(self.a_f16 && self.b_f16) {
            s += " autocast";
        }
        if self.a_t {
            s += " A^T";
        }
        if self.b_t {
            s += " B^T";
        }
        if self.gelu {
            s += " +bias+gelu";
        } else if self.residual {
            s += " +bias+residual";
        } else if self.bias {
            s += " +bias";
        }
        if !self.aligned {
            s += " unaligned";
        }
        s
    }
}

/// The kernel and tile a product runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TileChoice {
    Tiled(Tile),
    Coop(CoopTile),
}

impl TileChoice {
    /// `tiled 64x64x16/4x4` or `coop 2x4/4x2/32`.
    pub fn name(&self) -> String {
        match self {
            TileChoice::Tiled(t) => format!("tiled {}", t.name()),
            TileChoice::Coop(t) => format!("coop {}", t.name()),
        }
    }

    pub fn parse(s: &str) -> Option<TileChoice> {
        let (kind, tile) = s.split_once(' ')?;
        match kind {
            "tiled" => Tile::parse(tile).map(TileChoice::Tiled),
            "coop" => CoopTile::parse(tile).map(TileChoice::Coop),
            _ => None,
        }
    }
}

/// One measured entry, as the file holds it.
#[derive(Serialize, Deserialize)]
struct Entry {
    #[serde(flatten)]
    key: ProductKey,
    tile: String,
    /// Ranges of K (split-K), where measured; else the launcher's rule decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    split: Option<u32>,
    /// Median GPU time of the winning tile when it was measured.
    ms: f64,
}

#[derive(Serialize, Deserialize)]
struct File {
    adapter: String,
    driver: String,
    entries: Vec<Entry>,
}

/// The measured tiles of one adapter and driver.
#[derive(Default)]
pub struct TileTable {
    entries: HashMap<ProductKey, (TileChoice, Option<u32>, f64)>,
}

impl TileTable {
    pub fn get(&self, key: &ProductKey) -> Option<TileChoice> {
        self.entry(key).map(|(c, _, _)| *c)
    }

    /// The measured number of K ranges of `key`, if any.
    pub fn split(&self, key: &ProductKey) -> Option<u32> {
        self.entry(key).and_then(|(_, s, _)| *s)
    }

    /// `key`'s entry; a residual product without one of its own takes its bias product's.
    fn entry(&self, key: &ProductKey) -> Option<&(TileChoice, Option<u32>, f64)> {
        self.entries.get(key).or_else(|| {
            let bias = ProductKey {
                residual: false,
                ..*key
            };
            key.residual.then(|| self.entries.get(&bias)).flatten()
        })
    }

    /// Records `choice` with `split` K ranges (None: the launcher's rule), measured at `ms`,
    /// as the configuration of `key`.
    pub fn insert(&mut self, key: ProductKey, choice: TileChoice, split: Option<u32>, ms: f64) {
        self.entries.insert(key, (choice, split, ms));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// (key, tile, split, ms) in a stable order (by shape).
    pub fn rows(&self) -> Vec<(ProductKey, TileChoice, Option<u32>, f64)> {
        let mut rows: Vec<_> = self
            .entries
            .iter()
            .map(|(k, (c, split, ms))| (*k, *c, *split, *ms))
            .collect();
        rows.sort_by_key(|(k, _, _, _)| {
            (
                (k.m, k.n, k.k, k.batch),
                (k.half, k.a_f16, k.b_f16, k.a_t, k.b_t),
                (k.bias, k.gelu, k.residual, k.aligned),
            )
        });
        rows
    }

    /// The table as JSON, tagged with the adapter and driver it was measured on.
    pub fn to_json(&self, adapter: &str, driver: &str) -> String {
        let file = File {
            adapter: adapter.to_string(),
            driver: driver.to_string(),
            entries: self
                .rows()
                .into_iter()
                .map(|(key, c, split, ms)| Entry {
                    key,
                    tile: c.name(),
                    split,
                    ms,
                })
                .collect(),
        };
        serde_json::to_string_pretty(&file).expect("the tile table serializes")
    }

    /// Parses a table written by `to_json`; a table of another adapter or driver is empty (its
    /// timings say nothing here). Entries whose tile this build does not know are dropped.
    pub fn from_json(text: &str, adapter: &str, driver: &str) -> Result<TileTable, String> {
        let (a, d, table) = TileTable::parse(text)?;
        Ok(if a == adapter && d == driver {
            table
        } else {
            TileTable::default()
        })
    }

    /// A table as `to_json` writes it, with the adapter and driver it was measured on.
    pub fn parse(text: &str) -> Result<(String, String, TileTable), String> {
        let file: File = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let mut table = TileTable::default();
        for e in file.entries {
            if let Some(c) = TileChoice::parse(&e.tile) {
                table.insert(e.key, c, e.split.filter(|&s| s >= 1), e.ms);
            }
        }
        Ok((file.adapter, file.driver, table))
    }
}

/// Where the table of `info`'s adapter and driver lives in cache directory `dir`
/// (`Paths::cache_dir`): a file named after both.
pub fn cache_file(info: &wgpu::AdapterInfo, dir: &Path) -> PathBuf {
    dir.join(table_file_name(&info.name, &info.driver_info))
}

/// `matmul-tiles-ADAPTER-DRIVER.json`, each with what is not a letter, digit or dot as `-`.
pub fn table_file_name(adapter: &str, driver: &str) -> String {
    format!("matmul-tiles-{}-{}.json", clean(adapter), clean(driver))
}

fn clean(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// The tiled kernel's tiles a search measures: the defaults, other vector-run blocks, and the
/// interleaved blocks of the tiles that led before vector runs (64x64x16/4x4, 128x64x16/8x4).
pub fn tiled_search_tiles() -> Vec<Tile> {
    let mut v = TILES.to_vec();
    for (bm, bn, bk, tm, tn) in [
        (128, 128, 8, 8, 8),
        (128, 128, 16, 8, 8),
        (128, 64, 8, 8, 8),
        (64, 128, 8, 8, 8),
        (128, 64, 16, 8, 4),
        (64, 128, 16, 4, 8),
        (64, 64, 16, 4, 4),
        (64, 64, 32, 4, 4),
    ] {
        v.push(Tile::new(bm, bn, bk, tm, tn).vec());
    }
    v.push(Tile::new(64, 64, 16, 4, 4));
    v.push(Tile::new(128, 64, 16, 8, 4));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain f32 product of one M x N x K matrix, rows aligned: the tests' keys vary it.
    fn key(m: u32, n: u32, k: u32) -> ProductKey {
        ProductKey {
            m,
            n,
            k,
            batch: 1,
            half: false,
            a_f16: false,
            b_f16: false,
            a_t: false,
            b_t: false,
            bias: false,
            gelu: false,
            aligned: true,
            residual: false,
        }
    }

    #[test]
    fn a_table_round_trips_through_json_for_its_adapter_only() {
        let key = ProductKey {
            half: true,
            b_f16: true,
            b_t: true,
            ..key(4096, 50257, 768)
        };
        let mut t = TileTable::default();
        t.insert(
            key,
            TileChoice::parse("coop 2x4/4x2/64").unwrap(),
            Some(3),
            1.5,
        );
        let tiled = ProductKey { half: false, ..key };
        t.insert(tiled, TileChoice::Tiled(TILES[1]), None, 2.5);
        let json = t.to_json("GPU", "1.0");
        let back = TileTable::from_json(&json, "GPU", "1.0").unwrap();
        assert_eq!(back.rows().len(), 2);
        assert_eq!(back.get(&key), t.get(&key));
        assert_eq!(back.get(&tiled), Some(TileChoice::Tiled(TILES[1])));
        assert_eq!((back.split(&key), back.split(&tiled)), (Some(3), None));
        assert!(TileTable::from_json(&json, "GPU", "2.0")
            .unwrap()
            .is_empty());
        assert!(TileTable::from_json("{", "GPU", "1.0").is_err());
    }

    /// A bias product's entry keeps its K ranges; one written before bias products could split
    /// (no `split`) loads with none, so the launcher's rule decides.
    #[test]
    fn bias_entries_keep_their_splits_and_older_ones_load_without() {
        let key = ProductKey {
            half: true,
            a_f16: true,
            b_f16: true,
            bias: true,
            ..key(512, 768, 3072)
        };
        let mut t = TileTable::default();
        t.insert(key, TileChoice::Tiled(TILES[0]), Some(4), 0.05);
        let back = TileTable::from_json(&t.to_json("GPU", "1.0"), "GPU", "1.0").unwrap();
        assert_eq!(back.split(&key), Some(4));
        let older = r#"{"adapter": "GPU", "driver": "1.0", "entries": [
            {"m": 512, "n": 768, "k": 3072, "batch": 1, "half": true, "a_f16": true,
             "b_f16": true, "a_t": false, "b_t": false, "bias": true, "gelu": false,
             "aligned": true, "tile": "tiled 64x64x16/4x4", "ms": 0.07}]}"#;
        let old = TileTable::from_json(older, "GPU", "1.0").unwrap();
        // An interleaved tile's name, as tables written before vector runs name it.
        assert_eq!(
            old.get(&key),
            Some(TileChoice::Tiled(Tile::new(64, 64, 16, 4, 4)))
        );
        assert_eq!(old.split(&key), None);
    }

    /// A residual product takes its own entry where it has one, else its bias product's (a
    /// table searched before residual products tuned apart).
    #[test]
    fn residual_products_fall_back_to_their_bias_entries() {
        let bias = ProductKey {
            bias: true,
            ..key(4096, 768, 768)
        };
        let res = ProductKey {
            residual: true,
            ..bias
        };
        let mut t = TileTable::default();
        t.insert(bias, TileChoice::Tiled(TILES[0]), Some(2), 0.4);
        assert_eq!(t.get(&res), Some(TileChoice::Tiled(TILES[0])));
        assert_eq!(t.split(&res), Some(2));
        t.insert(res, TileChoice::Tiled(TILES[1]), None, 0.5);
        assert_eq!(t.get(&res), Some(TileChoice::Tiled(TILES[1])));
        assert_eq!(t.split(&res), None);
        assert_eq!(t.get(&bias), Some(TileChoice::Tiled(TILES[0])));
        // Not the other way: a bias product never takes a residual entry.
        let mut r = TileTable::default();
        r.insert(res, TileChoice::Tiled(TILES[1]), None, 0.5);
        assert_eq!(r.get(&bias), None);
        // Both entries survive a round trip through the file, in a stable order.
        let json = t.to_json("GPU", "1.0");
        assert_eq!(json, t.to_json("GPU", "1.0"));
        let back = TileTable::from_json(&json, "GPU", "1.0").unwrap();
        assert_eq!(back.rows().len(), 2);
        assert_eq!(back.get(&res), Some(TileChoice::Tiled(TILES[1])));
        assert_eq!(back.get(&bias), Some(TileChoice::Tiled(TILES[0])));
        assert_eq!(back.split(&bias), Some(2));
    }

    /// Vector runs need register blocks in multiples of 4; any other block the kernel's
    /// accumulators hold (rounded up to vectors) parses.
    #[test]
    fn vector_runs_need_blocks_of_four() {
        assert_eq!(
            Tile::parse("128x64x8/8x4v"),
            Some(Tile::new(128, 64, 8, 8, 4).vec())
        );
        assert_eq!(
            Tile::parse("128x64x8/8x4"),
            Some(Tile::new(128, 64, 8, 8, 4))
        );
        for bad in [
            "64x64x16/2x2v",
            "64x48x16/4x6v",
            "48x48x16/3x3v",
            "64x64x16/4x4w",
        ] {
            assert_eq!(Tile::parse(bad), None, "{bad}");
        }
        for odd in ["48x48x16/3x3", "32x48x16/2x3"] {
            assert!(Tile::parse(odd).is_some(), "{odd}");
        }
    }

    #[test]
    fn tile_names_parse_back() {
        for t in tiled_search_tiles() {
            let c = TileChoice::Tiled(t);
            assert_eq!(TileChoice::parse(&c.name()), Some(c));
        }
        assert_eq!(TileChoice::parse("tiled 1x2"), None);
        assert_eq!(TileChoice::parse("other 2x4/4x2"), None);
    }
}
