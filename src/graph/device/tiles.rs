//! The matmul tile table a Device runs with: the adapter's own (measured by `--tune` into the
//! cache directory) where there is one, else the table the project shipped for the adapter and
//! its driver (or the nearest driver measured), else none (the shape heuristics choose). And
//! what searches force while they time candidates.

use std::path::{Path, PathBuf};

use super::Device;
use crate::config::Paths;
use crate::kernels::attention::{Pass, Tile as AttentionTile};
use crate::kernels::tuning::{self, ProductKey, TileChoice, TileTable, SHIPPED};

/// Where a Device's tile table came from (`wgrad info` says it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TableSource {
    /// No table: every product on the tile the shape heuristics choose.
    None,
    /// The adapter's own, measured here (`--tune`), from this file.
    Measured(PathBuf),
    /// A table shipped with wgrad (`tiles/`): its file, the driver it was measured on, and
    /// whether that is this adapter's driver (else the nearest one measured).
    Shipped {
        file: &'static str,
        driver: String,
        exact: bool,
    },
}

impl std::fmt::Display for TableSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TableSource::None => write!(f, "none (the shape heuristics choose every tile)"),
            TableSource::Measured(path) => write!(f, "measured here: {}", path.display()),
            TableSource::Shipped {
                file, exact: true, ..
            } => write!(f, "shipped: tiles/{file}"),
            TableSource::Shipped { file, driver, .. } => write!(
                f,
                "shipped: tiles/{file} (measured on driver {driver}, the nearest to this one)"
            ),
        }
    }
}

/// The table `info`'s adapter runs with, and where it came from: its own cache file under
/// `paths` (an unreadable one is reported and passed over: a table only ever makes products
/// faster), else the shipped table of its driver or the nearest one.
pub(super) fn load(info: &wgpu::AdapterInfo, paths: &Paths) -> (TileTable, TableSource) {
    if let Some(dir) = &paths.cache_dir {
        if let Some(table) = read_cache(&tuning::cache_file(info, dir), info) {
            let source = TableSource::Measured(tuning::cache_file(info, dir));
            return (table, source);
        }
    }
    let parsed: Vec<(String, String, usize)> = SHIPPED
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let (adapter, driver, _) = TileTable::parse(t.json).ok()?;
            Some((adapter, driver, i))
        })
        .collect();
    match tuning::nearest_shipped(&parsed, &info.name, &info.driver_info) {
        Some((i, exact)) => {
            let (_, driver, table) =
                TileTable::parse(SHIPPED[i].json).expect("a shipped table parses (tested)");
            let source = TableSource::Shipped {
                file: SHIPPED[i].file,
                driver,
                exact,
            };
            (table, source)
        }
        None => (TileTable::default(), TableSource::None),
    }
}

/// The table in `path` if it is one of this adapter and driver with entries.
fn read_cache(path: &Path, info: &wgpu::AdapterInfo) -> Option<TileTable> {
    let text = std::fs::read_to_string(path).ok()?;
    match TileTable::from_json(&text, &info.name, &info.driver_info) {
        Ok(t) if !t.is_empty() => Some(t),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!("{}: not a tile table ({e}); ignored", path.display());
            None
        }
    }
}

impl Device {
    /// Where this device's tile table came from.
    pub fn tile_source(&self) -> &TableSource {
        &self.rt.tile_source
    }

    /// The file `--tune` writes this adapter's table to (None without a cache directory).
    pub fn tile_cache_file(&self) -> Option<PathBuf> {
        let dir = self.rt.options.paths.cache_dir.as_ref()?;
        Some(tuning::cache_file(&self.rt.gpu.info, dir))
    }

    /// Runs the f32 attention's passes on `tiles` (pass, tile at its padded head dim) where the
    /// kernel runs them and they fit, instead of the defaults (`&[]`: the defaults again). For
    /// tests and measurements; pipelines are specialized per tile, so switching costs a
    /// compile of each new one, nothing else.
    pub fn force_attention_tiles(&self, tiles: &[(Pass, AttentionTile)]) {
        self.state().attention_tiles = tiles.to_vec();
    }

    /// The f32 attention tiles forced (`force_attention_tiles`).
    pub fn attention_tiles(&self) -> Vec<(Pass, AttentionTile)> {
        self.state().attention_tiles.clone()
    }

    /// The tile to run `key` on: the forced one, else the measured one, if any (the caller
    /// checks it fits the product's kernel).
    pub fn tile_for(&self, key: &ProductKey) -> Option<TileChoice> {
        let mut s = self.state();
        if let Some(log) = s.product_log.as_mut() {
            if !log.contains(key) {
                log.push(*key);
            }
        }
        s.forced_tile.or_else(|| s.tiles.get(key))
    }

    /// Runs every product on `tile` (None: back to the table and the heuristics).
    pub fn force_tile(&self, tile: Option<TileChoice>) {
        self.state().forced_tile = tile;
    }

    /// The number of K ranges `key` runs in, where forced or measured (else the launcher's
    /// rule decides).
    pub fn split_for(&self, key: &ProductKey) -> Option<u32> {
        let s = self.state();
        s.forced_split.or_else(|| s.tiles.split(key))
    }

    /// Runs every product that may split K in `split` ranges (None: back to the table and the
    /// rule).
    pub fn force_split(&self, split: Option<u32>) {
        self.state().forced_split = split;
    }

    /// Records a measured tile and K ranges for `key` (kept in memory; `tile_table_json`
    /// writes it out).
    pub fn set_tile(&self, key: ProductKey, tile: TileChoice, split: Option<u32>, ms: f64) {
        self.state().tiles.insert(key, tile, split, ms);
    }

    /// The measured configurations as rows (key, tile, split, ms).
    pub fn tile_rows(&self) -> Vec<(ProductKey, TileChoice, Option<u32>, f64)> {
        self.state().tiles.rows()
    }

    /// The table as its cache file holds it.
    pub fn tile_table_json(&self) -> String {
        let info = &self.rt.gpu.info;
        self.state().tiles.to_json(&info.name, &info.driver_info)
    }

    /// Starts (or stops) logging the distinct matmul products recorded.
    pub fn log_products(&self, on: bool) {
        self.state().product_log = on.then(Vec::new);
    }

    /// The products logged since `log_products(true)`; logging goes on.
    pub fn take_product_log(&self) -> Vec<ProductKey> {
        self.state()
            .product_log
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }
}
