//! How a product runs, decided without a GPU: from the product's shapes, types, layouts and
//! epilogue (`Product`), what the adapter and the options allow (`Target`) and the tile table
//! (`Tables`), the kernel and its tile, how K is split and summed, how the column sums and the
//! residual are made, and how C is stored (`Plan`). `launch` records what the plan says.
//!
//! Shapes: A (batch, M, K), B (batch, K, N), C (batch, M, N).

use crate::graph::DType;
use crate::kernels::matmul::{self, OperandLayout, Tile, Types};
use crate::kernels::matmul_coop::{self, CStore, Coop, CoopTile};
use crate::kernels::tuning::{ProductKey, TileChoice};

use super::SPLIT_TAIL_STEPS;

/// What the kernel applies to each product element, as the plan sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpilogueKind {
    None,
    Bias,
    /// Bias, then GELU, the pre-activation stored too (f16 where `pre_f16`).
    BiasGelu {
        pre_f16: bool,
    },
    /// B's column sums beside the product (A extended by a row of ones).
    ColumnSums,
    /// Bias and a residual (contiguous f32 (M, N) from `offset` in a binding of `bound`
    /// elements); `shared`: it lies in the buffer of an operand or the bias.
    BiasResidual {
        offset: usize,
        bound: usize,
        shared: bool,
    },
}

/// C as the kernel writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutLayout {
    pub dtype: DType,
    pub offset: usize,
    pub batch_stride: usize,
    pub row_stride: usize,
    pub col_stride: usize,
    /// Elements its binding holds.
    pub bound: usize,
}

/// One product: A and B as read, C as written (`acc`: added into), the epilogue.
#[derive(Clone, Copy, Debug)]
pub struct Product {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub types: Types,
    pub a: OperandLayout,
    pub b: OperandLayout,
    pub c: OutLayout,
    pub acc: bool,
    pub epilogue: EpilogueKind,
    /// Every operand's rows and C's start on 8 elements (`tuning::rows_aligned`).
    pub aligned: bool,
}

/// What the adapter and the options allow.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    /// The adapter's cooperative matrices, if any.
    pub coop: Option<Coop>,
    /// f32 products run as X3 on them (`Device::f32_on_tensor_cores`).
    pub f32_tensor_cores: bool,
    /// Split products may sum in their own dispatch (`Device::split_in_one_dispatch`).
    pub split_in_one_dispatch: bool,
    pub max_workgroup_bytes: u32,
    pub max_lanes: u32,
    /// Bytes one storage binding may hold.
    pub max_binding: u64,
    /// A `lab` build's knobs (None in a default build).
    pub lab: LabChoices,
}

/// What a `lab` build may force (see `config::Lab`).
#[derive(Clone, Copy, Debug, Default)]
pub struct LabChoices {
    pub coop_tile: Option<CoopTile>,
    pub matmul_tile: Option<Tile>,
    pub split_target: Option<usize>,
    pub split_max: Option<usize>,
    pub split_tail: Option<usize>,
}

/// The tile table's word on a product: its tile and number of K ranges, where measured (or
/// forced by a search).
pub trait Tables {
    fn tile(&self, key: &ProductKey) -> Option<TileChoice>;
    fn split(&self, key: &ProductKey) -> Option<u32>;
}

/// The kernel a product runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Cooperative matrices; `x3`: f32 operands as three f16 products.
    Coop {
        coop: Coop,
        tile: CoopTile,
        x3: bool,
    },
    Tiled(Tile),
}

impl Kernel {
    /// (BM, BN, BK): the workgroup's block of C and its step of K.
    pub fn block(&self) -> (usize, usize, usize) {
        match *self {
            Kernel::Coop { coop, tile, .. } => (
                tile.bm(coop.fs) as usize,
                tile.bn(coop.fs) as usize,
                tile.bk as usize,
            ),
            Kernel::Tiled(t) => (t.bm as usize, t.bn as usize, t.bk as usize),
        }
    }
}

/// How K is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// One range: the kernel writes C.
    Whole,
    /// `splits` ranges of `k_split`, each tile's last range summing the partials in the same
    /// dispatch (`matmul_split_tail.wgsl`).
    InOneDispatch { splits: usize, k_split: usize },
    /// `splits` ranges of `k_split` writing f32 partials (S, M, N), summed by a second kernel.
    SecondDispatch { splits: usize, k_split: usize },
}

/// What `plan` decided.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Plan {
    /// Column sums asked for where the kernel cannot extend A (a batch, or M not a multiple
    /// of 8 on cooperative matrices): a reduction, then the plain product.
    SumsByReduction,
    /// A residual added by a second dispatch after the bias product: where the
    /// cooperative-matrix kernel could store C straight from its accumulators (the residual
    /// epilogue measured slower there), or where the residual shares a buffer the product
    /// reads (a buffer bound for writing may not be bound twice).
    ResidualByAdd,
    Run(Run),
}

/// A product the kernels run as planned.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Run {
    /// The key the tile table knows it by.
    pub key: ProductKey,
    pub kernel: Kernel,
    pub split: Split,
    /// M as the kernel runs it (one more row with column sums).
    pub m_run: usize,
    /// The types and accumulation of the product's own kernel (f32 partials, not added into,
    /// where a second dispatch sums).
    pub kernel_types: Types,
    pub kernel_acc: bool,
    /// C is added into (the product's own kernel, or the second dispatch's sum).
    pub acc: bool,
    /// How a cooperative-matrix kernel stores C.
    pub c_store: CStore,
    /// The vector epilogue's `pre` (GELU's pre-activation, the residual) bound in vectors.
    pub pre_vectors: bool,
}

impl Product {
    /// The tile table's key of the product on `target` (before the residual's adjustment).
    fn raw_key(&self) -> ProductKey {
        let e = self.epilogue;
        ProductKey {
            m: self.m as u32,
            n: self.n as u32,
            k: self.k as u32,
            batch: self.batch as u32,
            half: self.types.half,
            a_f16: self.types.a == DType::F16,
            b_f16: self.types.b == DType::F16,
            a_t: self.a.row_stride == 1 && self.a.col_stride != 1,
            b_t: self.b.row_stride == 1 && self.b.col_stride != 1,
            // Column sums run the plain product with one more row: its measured tile serves.
            bias: matches!(
                e,
                EpilogueKind::Bias
                    | EpilogueKind::BiasGelu { .. }
                    | EpilogueKind::BiasResidual { .. }
            ),
            gelu: matches!(e, EpilogueKind::BiasGelu { .. }),
            residual: matches!(e, EpilogueKind::BiasResidual { .. }),
            aligned: self.aligned,
        }
    }
}

impl Target {
    /// Whether a product of `key` (f32 operands, not mixed precision) runs as X3.
    pub fn x3(&self, key: &ProductKey) -> bool {
        !key.half && !key.a_f16 && !key.b_f16 && self.f32_tensor_cores
    }

    /// The cooperative matrices a product of `key` runs on: the adapter's, for a
    /// mixed-precision product, and for an f32 one as X3.
    pub fn coop_for(&self, key: &ProductKey) -> Option<Coop> {
        self.coop.filter(|_| key.half || self.x3(key))
    }

    /// Whether `tile` suits the kernel a product of `key` runs on and fits the adapter.
    pub fn runs(&self, key: &ProductKey, tile: TileChoice) -> bool {
        match (tile, self.coop_for(key)) {
            (TileChoice::Coop(t), Some(coop)) => {
                t.valid(coop, self.max_workgroup_bytes, self.x3(key))
            }
            (TileChoice::Tiled(t), None) => {
                t.workgroup_bytes() <= self.max_workgroup_bytes && t.lanes() <= self.max_lanes
            }
            _ => false,
        }
    }

    /// The tile the shape heuristics (or a `lab` build's forced tile) choose for `key`.
    pub fn heuristic_tile(&self, key: &ProductKey) -> TileChoice {
        let (m, n, batch) = (key.m as usize, key.n as usize, key.batch as usize);
        let forced = match self.coop_for(key) {
            Some(_) => self.lab.coop_tile.map(TileChoice::Coop),
            None => self.lab.matmul_tile.map(TileChoice::Tiled),
        };
        if let Some(t) = forced.filter(|t| self.runs(key, *t)) {
            return t;
        }
        match self.coop_for(key) {
            Some(coop) => TileChoice::Coop(matmul_coop::choose_tile(
                m,
                n,
                batch,
                coop,
                self.max_workgroup_bytes,
                self.x3(key),
            )),
            None => TileChoice::Tiled(matmul::choose_tile(m, n, batch)),
        }
    }

    /// The kernel of `key`: the table's tile where it suits the kernel and fits, else the
    /// heuristics'.
    pub fn kernel(&self, key: &ProductKey, tables: &dyn Tables) -> Kernel {
        let tile = tables
            .tile(key)
            .filter(|t| self.runs(key, *t))
            .unwrap_or_else(|| self.heuristic_tile(key));
        match (tile, self.coop_for(key)) {
            (TileChoice::Coop(tile), Some(coop)) => Kernel::Coop {
                coop,
                tile,
                x3: self.x3(key),
            },
            (TileChoice::Tiled(t), _) => Kernel::Tiled(t),
            (TileChoice::Coop(_), None) => {
                unreachable!("heuristic and checked tiles suit the kernel")
            }
        }
    }

    /// The measured number of K ranges of `key`, where the table's tile for it suits the
    /// kernel it runs on here (a table searched for the tiled f32 kernel does not speak for an
    /// X3 product).
    pub fn measured_split(&self, key: &ProductKey, tables: &dyn Tables) -> Option<u32> {
        match tables.tile(key) {
            Some(t) if !self.runs(key, t) => None,
            _ => tables.split(key),
        }
    }

    /// The most ranges of K an M x N product may split into: its f32 partial products
    /// (S, M, N) fit one storage binding (at least 1).
    pub fn max_splits(&self, m: usize, n: usize) -> usize {
        (self.max_binding as usize / (4 * m * n).max(1)).max(1)
    }

    /// Whether a product split into `splits` ranges of K sums them in its own dispatch: on
    /// the tiled kernel or the cooperative-matrix one (not X3, whose operands' scales take
    /// the partials' binding), a ticket for each of its tiles, and a short enough sum.
    fn sums_in_one_dispatch(&self, kernel: &Kernel, (m, n): (usize, usize), splits: usize) -> bool {
        let (bm, bn, lanes) = match *kernel {
            Kernel::Tiled(t) => (t.bm, t.bn, t.lanes()),
            Kernel::Coop { x3: true, .. } => return false,
            Kernel::Coop { coop, tile, .. } => {
                (tile.bm(coop.fs), tile.bn(coop.fs), tile.lanes(coop.sgs))
            }
        };
        let tiles = m.div_ceil(bm as usize) * n.div_ceil(bn as usize);
        let passes = (bm * bn).div_ceil(lanes * super::SPLIT_CHUNK) as usize;
        // The partials (whole tiles) and the tickets within one binding each.
        let binding = self.max_binding as usize;
        let part_bytes = 4 * splits * tiles * (bm * bn) as usize;
        self.split_in_one_dispatch
            && tiles <= crate::graph::SPLIT_TICKETS.min(binding / 4)
            && part_bytes <= binding
            && splits * passes <= self.lab.split_tail.unwrap_or(SPLIT_TAIL_STEPS)
    }
}

/// How the product runs (see the module's note). `p.m`, `p.n`, `p.k` and the output are not
/// empty (the caller handles those).
pub fn plan(p: &Product, target: &Target, tables: &dyn Tables) -> Plan {
    let (m, n, k, batch) = (p.m, p.n, p.k, p.batch);
    let key = p.raw_key();
    // The tiled kernel's residual entry point tunes apart from its bias one, and so does an X3
    // product's (its residual products run the residual epilogue). The mixed-precision
    // cooperative-matrix kernel runs some residual products as bias products and an add, so
    // there the bias product's entry serves. (A table without residual entries serves them
    // with their bias entries.)
    let key = ProductKey {
        residual: key.residual && (target.coop_for(&key).is_none() || target.x3(&key)),
        ..key
    };
    let kernel = target.kernel(&key, tables);
    let on_coop = matches!(kernel, Kernel::Coop { .. });
    let on_x3 = matches!(kernel, Kernel::Coop { x3: true, .. });
    let sums = p.epilogue == EpilogueKind::ColumnSums;
    if sums && (batch != 1 || (on_coop && !m.is_multiple_of(8))) {
        return Plan::SumsByReduction;
    }
    // With column sums the kernels run one more row of A (ones) and of C (the sums).
    let m_run = m + sums as usize;
    let (bm, bn, bk) = kernel.block();
    let tiles = m_run.div_ceil(bm) * n.div_ceil(bn) * batch;
    // Too few workgroups over a long K: ranges of K in workgroups of their own, partial
    // products summed in the same dispatch by each tile's last range or by a second kernel,
    // either adding a bias product's bias and residual (plain, bias and residual products;
    // batch 1; GELU's epilogue does not split).
    let splittable = !matches!(p.epilogue, EpilogueKind::BiasGelu { .. }) && batch == 1;
    let split = if splittable {
        match target.measured_split(&key, tables) {
            // Measured (or forced by a search): at most one range a K step.
            Some(s) => (s as usize).clamp(1, k.div_ceil(bk)),
            None => {
                let goal = target
                    .lab
                    .split_target
                    .unwrap_or(matmul::SPLIT_TARGET_GROUPS);
                matmul::split_k(tiles, k, goal)
            }
        }
        .min(target.max_splits(m_run, n))
        .min(target.lab.split_max.unwrap_or(usize::MAX))
    } else {
        1
    };
    // Ranges a whole number of K steps long (so vector units stay aligned).
    let k_split = k.div_ceil(split).next_multiple_of(bk);
    let splits = k.div_ceil(k_split);
    let one_dispatch = split > 1 && target.sums_in_one_dispatch(&kernel, (m_run, n), splits);
    if let EpilogueKind::BiasResidual { shared, .. } = p.epilogue {
        // The residual epilogue cost more than the add where the cooperative-matrix kernel
        // could store C's tiles straight from its accumulators (unsplit, f32 C on 16-byte
        // rows): the 8 x 512 --amp step 23.21 / 23.26 -> 23.38 / 23.68 ms on an H200
        // (2026-11-25), and no less through the scratch on an H100 (16.83-16.97 ms against
        // 16.92-17.13, 2026-11-26; docs/decisions.md). Split, the sum adds it.
        let c = &p.c;
        let rows_on_16_bytes = c.dtype == DType::F32
            && [c.offset, c.row_stride, c.batch_stride]
                .iter()
                .all(|x| x.is_multiple_of(4));
        if shared || (on_coop && !on_x3 && split == 1 && rows_on_16_bytes) {
            return Plan::ResidualByAdd;
        }
    }
    let split = match (split, one_dispatch) {
        (1, _) => Split::Whole,
        (_, true) => Split::InOneDispatch { splits, k_split },
        (_, false) => Split::SecondDispatch { splits, k_split },
    };
    // With a split summed by a second kernel the product's kernel writes f32 partials (no
    // bias); the sum adds the bias and adds into or writes C.
    let (kernel_types, kernel_acc) = match split {
        Split::SecondDispatch { .. } => (
            Types {
                c: DType::F32,
                ..p.types
            },
            false,
        ),
        _ => (p.types, p.acc),
    };
    // C through the scratch tile, in vectors of 4 where C takes them (unsplit: a split's
    // partials are summed elsewhere).
    let c_store = if on_coop && split == Split::Whole && stores_vectors(kernel_types.c, p) {
        CStore::Vec4
    } else {
        CStore::Elems
    };
    // The vector epilogue's `pre` (GELU's pre-activation, new and contiguous from 0; or the
    // residual, contiguous from its offset) in vectors too, where its rows start on vectors
    // inside the binding.
    let pre_rows_on_vectors = n.is_multiple_of(4)
        && match p.epilogue {
            EpilogueKind::BiasGelu { .. } => true,
            EpilogueKind::BiasResidual { offset, bound, .. } => {
                offset.is_multiple_of(4) && offset + m * n <= bound
            }
            _ => false,
        };
    let pre_vectors = match kernel {
        Kernel::Coop { coop, .. } => {
            c_store == CStore::Vec4 && coop.stores_vectors() && pre_rows_on_vectors
        }
        Kernel::Tiled(_) => false,
    };
    Plan::Run(Run {
        key,
        kernel,
        split,
        m_run,
        kernel_types,
        kernel_acc,
        acc: p.acc,
        c_store,
        pre_vectors,
    })
}

/// Whether the cooperative-matrix kernel may bind C as vectors of 4 and store 4 consecutive
/// columns at once (`CStore::Vec4`): f16 or f32 elements (`c`, the kernel's), unit-stride
/// columns, offset and row and batch strides multiples of 4 (every row starts on a vector),
/// and the vector holding C's last element inside the binding.
fn stores_vectors(c: DType, p: &Product) -> bool {
    let o = &p.c;
    let (batch, m, n) = (p.batch, p.m, p.n);
    let aligned = [
        o.offset,
        o.row_stride,
        if batch > 1 { o.batch_stride } else { 0 },
    ]
    .iter()
    .all(|x| x.is_multiple_of(4));
    let last =
        o.offset + (batch.max(1) - 1) * o.batch_stride + (m.max(1) - 1) * o.row_stride + n.max(1)
            - 1;
    matches!(c, DType::F16 | DType::F32)
        && o.col_stride == 1
        && aligned
        && (last / 4 + 1) * 4 <= o.bound
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matmul::TILES;
    use crate::kernels::matmul_coop::{COOP_TILES, X3_TILES};
    use std::collections::HashMap;

    /// No table: the heuristics choose.
    struct NoTable;

    impl Tables for NoTable {
        fn tile(&self, _: &ProductKey) -> Option<TileChoice> {
            None
        }
        fn split(&self, _: &ProductKey) -> Option<u32> {
            None
        }
    }

    /// An NVIDIA GPU as its Vulkan driver reports it (cooperative matrices 16x16x16, 48 KiB
    /// of workgroup memory, 2 GiB bindings).
    fn nvidia() -> Target {
        Target {
            coop: Some(Coop::NVIDIA),
            f32_tensor_cores: true,
            split_in_one_dispatch: true,
            max_workgroup_bytes: 48 << 10,
            max_lanes: 1024,
            max_binding: (2 << 30) - 16,
            lab: LabChoices::default(),
        }
    }

    /// lavapipe: no cooperative matrices, 32 KiB of workgroup memory, 128 MiB bindings.
    fn lavapipe() -> Target {
        Target {
            coop: None,
            f32_tensor_cores: false,
            split_in_one_dispatch: true,
            max_workgroup_bytes: 32 << 10,
            max_lanes: 1024,
            max_binding: 128 << 20,
            lab: LabChoices::default(),
        }
    }

    /// A row-major (rows, cols) operand of `dtype` in a binding of its own size.
    fn operand(dtype: DType, rows: usize, cols: usize) -> OperandLayout {
        OperandLayout {
            dtype,
            offset: 0,
            batch_stride: rows * cols,
            batch: 1,
            rows,
            row_stride: cols,
            cols,
            col_stride: 1,
            bound_elements: rows * cols,
        }
    }

    /// M x N x K into a new contiguous C of `c`, A of `a` and B of `b` row-major, half when
    /// either operand is f16 (or `half`).
    fn product(
        m: usize,
        n: usize,
        k: usize,
        (a, b, c): (DType, DType, DType),
        half: bool,
    ) -> Product {
        Product {
            m,
            n,
            k,
            batch: 1,
            types: Types {
                a,
                b,
                c,
                half: half || a == DType::F16 || b == DType::F16,
            },
            a: operand(a, m, k),
            b: operand(b, k, n),
            c: OutLayout {
                dtype: c,
                offset: 0,
                batch_stride: m * n,
                row_stride: n,
                col_stride: 1,
                bound: m * n,
            },
            acc: false,
            epilogue: EpilogueKind::None,
            aligned: [m, n, k].iter().all(|x| x.is_multiple_of(8)),
        }
    }

    const F16_F32: (DType, DType, DType) = (DType::F16, DType::F16, DType::F32);
    const F32: (DType, DType, DType) = (DType::F32, DType::F32, DType::F32);

    fn run(p: Plan) -> Run {
        match p {
            Plan::Run(r) => r,
            other => panic!("expected the kernels to run it, got {other:?}"),
        }
    }

    #[test]
    fn a_large_f16_product_takes_the_largest_cooperative_tile_whole_and_stores_vectors() {
        let p = product(4096, 4096, 4096, F16_F32, false);
        let r = run(plan(&p, &nvidia(), &NoTable));
        assert_eq!(
            r.kernel,
            Kernel::Coop {
                coop: Coop::NVIDIA,
                tile: COOP_TILES[0],
                x3: false
            }
        );
        assert_eq!(
            (r.split, r.c_store, r.m_run),
            (Split::Whole, CStore::Vec4, 4096)
        );
        // The same on lavapipe: the tiled kernel's largest tile.
        let r = run(plan(&p, &lavapipe(), &NoTable));
        assert_eq!(r.kernel, Kernel::Tiled(TILES[0]));
        assert_eq!(r.c_store, CStore::Elems);
    }

    #[test]
    fn f32_products_run_as_x3_only_where_tensor_cores_are_asked_for() {
        let p = product(4096, 4096, 4096, F32, false);
        let r = run(plan(&p, &nvidia(), &NoTable));
        assert_eq!(
            r.kernel,
            Kernel::Coop {
                coop: Coop::NVIDIA,
                tile: X3_TILES[0],
                x3: true
            }
        );
        let tiled = Target {
            f32_tensor_cores: false,
            ..nvidia()
        };
        assert!(matches!(
            run(plan(&p, &tiled, &NoTable)).kernel,
            Kernel::Tiled(_)
        ));
    }

    #[test]
    fn few_tiles_over_a_long_k_split_and_sum_in_one_dispatch_or_a_second() {
        let p = product(768, 768, 16384, F16_F32, false);
        let r = run(plan(&p, &nvidia(), &NoTable));
        let Split::InOneDispatch { splits, k_split } = r.split else {
            panic!("{:?}", r.split);
        };
        assert!(splits > 1 && splits * k_split >= 16384 && k_split % 32 == 0);
        assert_eq!((r.kernel_types.c, r.kernel_acc), (DType::F32, false));
        // Without the sum in the product's dispatch: f32 partials, not added into.
        let apart = Target {
            split_in_one_dispatch: false,
            ..nvidia()
        };
        let acc = Product { acc: true, ..p };
        let r = run(plan(&acc, &apart, &NoTable));
        assert!(
            matches!(r.split, Split::SecondDispatch { .. }),
            "{:?}",
            r.split
        );
        assert_eq!(
            (r.kernel_types.c, r.kernel_acc, r.acc),
            (DType::F32, false, true)
        );
        // GELU's epilogue never splits.
        let gelu = Product {
            epilogue: EpilogueKind::BiasGelu { pre_f16: true },
            ..p
        };
        assert_eq!(run(plan(&gelu, &nvidia(), &NoTable)).split, Split::Whole);
        // A lab build's cap of 1: none split.
        let capped = Target {
            lab: LabChoices {
                split_max: Some(1),
                ..LabChoices::default()
            },
            ..nvidia()
        };
        assert_eq!(run(plan(&p, &capped, &NoTable)).split, Split::Whole);
    }

    #[test]
    fn column_sums_extend_a_where_the_kernel_can_and_are_reduced_elsewhere() {
        let sums = |m| Product {
            epilogue: EpilogueKind::ColumnSums,
            ..product(m, 768, 512, F16_F32, false)
        };
        // M a multiple of 8: one more row of ones.
        assert_eq!(run(plan(&sums(512), &nvidia(), &NoTable)).m_run, 513);
        // Not on cooperative matrices: reduced; the tiled kernel extends any M.
        assert_eq!(plan(&sums(511), &nvidia(), &NoTable), Plan::SumsByReduction);
        assert_eq!(run(plan(&sums(511), &lavapipe(), &NoTable)).m_run, 512);
        // A batch: reduced on any adapter.
        let batched = Product {
            batch: 2,
            ..sums(512)
        };
        assert_eq!(plan(&batched, &lavapipe(), &NoTable), Plan::SumsByReduction);
    }

    #[test]
    fn a_residual_is_added_apart_where_c_could_be_stored_straight_or_shares_a_buffer() {
        let residual = |shared| Product {
            epilogue: EpilogueKind::BiasResidual {
                offset: 0,
                bound: 4096 * 768,
                shared,
            },
            // K too short to split: the product stores C itself.
            ..product(4096, 768, 256, F16_F32, false)
        };
        assert_eq!(
            plan(&residual(false), &nvidia(), &NoTable),
            Plan::ResidualByAdd
        );
        // Split, the sum adds the residual.
        let long = Product {
            k: 768,
            a: operand(DType::F16, 4096, 768),
            b: operand(DType::F16, 768, 768),
            ..residual(false)
        };
        assert!(run(plan(&long, &nvidia(), &NoTable)).split != Split::Whole);
        let r = run(plan(&residual(false), &lavapipe(), &NoTable));
        assert!(
            r.key.residual,
            "the tiled kernel's residual products tune apart"
        );
        assert_eq!(
            plan(&residual(true), &lavapipe(), &NoTable),
            Plan::ResidualByAdd
        );
    }

    /// A table as a map from key to (tile, split).
    struct Map(HashMap<ProductKey, (TileChoice, Option<u32>)>);

    impl Tables for Map {
        fn tile(&self, key: &ProductKey) -> Option<TileChoice> {
            self.0.get(key).map(|e| e.0)
        }
        fn split(&self, key: &ProductKey) -> Option<u32> {
            self.0.get(key).and_then(|e| e.1)
        }
    }

    #[test]
    fn the_tables_tile_and_split_win_where_they_suit_the_kernel() {
        let p = product(512, 768, 3072, F16_F32, false);
        let key = p.raw_key();
        let coop_tile = COOP_TILES[1];
        let table = Map(HashMap::from([(
            key,
            (TileChoice::Coop(coop_tile), Some(3)),
        )]));
        let r = run(plan(&p, &nvidia(), &table));
        assert_eq!(
            r.kernel,
            Kernel::Coop {
                coop: Coop::NVIDIA,
                tile: coop_tile,
                x3: false
            }
        );
        assert!(
            matches!(r.split, Split::InOneDispatch { splits: 3, .. }),
            "{:?}",
            r.split
        );
        // On lavapipe the cooperative tile cannot run: the heuristics choose, and the table's
        // split (measured for another kernel) does not speak for it either.
        let r = run(plan(&p, &lavapipe(), &table));
        assert!(matches!(r.kernel, Kernel::Tiled(_)));
        assert_eq!(
            lavapipe().measured_split(&key, &table),
            None,
            "a split measured for another kernel"
        );
        // A lab build's forced tile, where it runs.
        let forced = Target {
            lab: LabChoices {
                matmul_tile: Some(TILES[2]),
                ..LabChoices::default()
            },
            ..lavapipe()
        };
        assert_eq!(
            run(plan(&p, &forced, &NoTable)).kernel,
            Kernel::Tiled(TILES[2])
        );
    }
}
