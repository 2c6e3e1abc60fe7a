//! Reverse-mode autograd over the lazy ops.
//!
//! A tensor that needs a gradient carries a record (`Meta`): a `Leaf` (a parameter, its
//! gradient persisting across steps), a `Node` (the result of an op: its backward rule with
//! exactly the state it saved, and its inputs), or a `View` of such a tensor (reshape,
//! permute, narrow: the view's layout says where its gradient lands in the base's gradient).
//!
//! `backward` walks the nodes in reverse topological order and records each rule's kernels into
//! the same lazy Segment as the forward pass: no host sync. Each rule writes its contribution
//! through a target the traversal chooses (`Out`): a new tensor for a first contribution, the
//! persisted gradient buffer of a leaf (overwritten by the first write after `zero_grad`:
//! zeroing folded into that write), or that buffer again with accumulate on, so a second
//! contribution is added by the producing kernel itself. Saved tensors and inputs are released
//! as soon as their rule has been recorded; the graph is gone after backward.

mod backward;
pub mod gradcheck;

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub(crate) use backward::BackwardCtx;

use crate::error::{Error, Result};
use crate::graph::{Layout, Tensor};
use crate::kernels::reduce::ReduceOp;

/// A backward rule: from the gradient of the output, the gradients of the inputs.
pub(crate) trait Backward: Send + Sync {
    fn name(&self) -> &'static str;
    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()>;

    /// Whether this rule reads its output's gradient as f16 as well as f32, so that a
    /// consumer that is all that contributes to it may store it f16
    /// (`BackwardCtx::input_takes_half`). Asked once, when the op is recorded.
    fn takes_half_grad(&self) -> bool {
        false
    }
}

pub(crate) struct Node {
    id: u64,
    name: &'static str,
    /// The rule's `takes_half_grad`.
    takes_half: bool,
    rule: Mutex<Option<Box<dyn Backward>>>,
    inputs: Mutex<Vec<Tensor>>,
}

pub(crate) struct Leaf {
    grad: Mutex<GradSlot>,
}

#[derive(Default)]
struct GradSlot {
    grad: Option<Tensor>,
    /// Logically zero: the next write overwrites instead of adding.
    stale: bool,
}

pub(crate) enum Meta {
    Leaf(Arc<Leaf>),
    Node(Arc<Node>),
    /// A view of `base` (a leaf or node tensor, never itself a view): `rel` is the view's layout
    /// over a row-major image of the base (offset 0), whatever the base's own storage layout.
    /// The view's gradient is `rel` applied to the base's (row-major) gradient buffer.
    View {
        base: Tensor,
        rel: Layout,
    },
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static NO_GRAD_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Runs `f` without recording any backward work (inference, optimizer updates).
pub fn no_grad<T>(f: impl FnOnce() -> T) -> T {
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            NO_GRAD_DEPTH.with(|d| d.set(d.get() - 1));
        }
    }
    NO_GRAD_DEPTH.with(|d| d.set(d.get() + 1));
    let _restore = Restore;
    f()
}

pub fn grad_enabled() -> bool {
    NO_GRAD_DEPTH.with(|d| d.get() == 0)
}

pub(crate) fn meta(t: &Tensor) -> Option<&Meta> {
    t.attachment().and_then(|a| a.downcast_ref::<Meta>())
}

/// Attaches a backward node to `out` when recording is on and an input needs a gradient.
/// `rule` is built only then (it saves tensors).
pub(crate) fn record<B: Backward + 'static>(
    out: Tensor,
    inputs: &[&Tensor],
    rule: impl FnOnce() -> B,
) -> Tensor {
    if !grad_enabled() || !inputs.iter().any(|t| meta(t).is_some()) {
        return out;
    }
    let rule = rule();
    let node = Node {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        name: rule.name(),
        takes_half: rule.takes_half_grad(),
        rule: Mutex::new(Some(Box::new(rule))),
        inputs: Mutex::new(inputs.iter().map(|t| (*t).clone()).collect()),
    };
    out.with_attachment(Some(Arc::new(Meta::Node(Arc::new(node)))))
}

/// The view `view` that `f` made of `src`'s layout gets `src`'s record (an injective view:
/// reshape, permute, narrow, (un)squeeze): `f` is replayed on the row-major image of the base.
pub(crate) fn record_view(
    src: &Tensor,
    view: Tensor,
    f: impl Fn(&Layout) -> Option<Layout>,
) -> Tensor {
    if !grad_enabled() {
        return view;
    }
    let (base, image) = match meta(src) {
        None => return view,
        Some(Meta::View { base, rel }) => (base.clone(), rel.clone()),
        Some(_) => (src.clone(), Layout::contiguous(src.shape())),
    };
    match f(&image) {
        Some(rel) => view.with_attachment(Some(Arc::new(Meta::View { base, rel }))),
        // The view exists in storage but not on the row-major image (a reshape of a view whose
        // image is not contiguous): route its gradient through a reshape of g instead.
        None => {
            let src_shape = src.shape().to_vec();
            record(view, &[src], || ReshapeBackward { src_shape })
        }
    }
}

/// `copy` (another storage holding `src`'s values, e.g. an f16 copy of a parameter) takes
/// `src`'s place in the graph: its gradient lands in `src`'s gradient, in f32, as a view
/// covering all of `src` would. `src` is a leaf or a node, not a view.
pub(crate) fn alias_for_grad(src: &Tensor, copy: Tensor) -> Result<Tensor> {
    if copy.shape() != src.shape() {
        return Err(Error::ShapeMismatch {
            op: "alias_for_grad",
            expected: format!("a copy of shape {:?}", src.shape()),
            got: copy.shape().to_vec(),
        });
    }
    match meta(src) {
        None => Ok(copy),
        Some(Meta::View { .. }) => Err(Error::InvalidArgument {
            op: "alias_for_grad",
            reason: "the source is a view; alias its base".into(),
        }),
        Some(_) => Ok(copy.with_attachment(Some(Arc::new(Meta::View {
            base: src.clone(),
            rel: Layout::contiguous(src.shape()),
        })))),
    }
}

/// Backward of a view that has no image on its base: g reshaped (copied if need be) to the
/// source's shape.
struct ReshapeBackward {
    src_shape: Vec<usize>,
}

impl Backward for ReshapeBackward {
    fn name(&self) -> &'static str {
        "reshape"
    }

    fn backward(self: Box<Self>, g: &Tensor, ctx: &mut BackwardCtx<'_>) -> Result<()> {
        let g = g.reshape(&self.src_shape)?;
        ctx.put(0, g)
    }
}

/// The record of a reduction (kept dims of size 1 in `out`).
pub(crate) fn record_reduce(
    x: &Tensor,
    out: Tensor,
    op: ReduceOp,
    dims: &[usize],
    scale: f32,
) -> Result<Tensor> {
    let keep_shape: Vec<usize> = (0..x.rank())
        .map(|d| if dims.contains(&d) { 1 } else { x.shape()[d] })
        .collect();
    let plain = out.clone();
    Ok(record(out, &[x], || {
        crate::ops::ReduceBackward::new(op, x, &plain, keep_shape, scale)
    }))
}

impl Tensor {
    /// This tensor as a parameter: a leaf whose gradient `backward` fills and that persists
    /// until `zero_grad`.
    pub fn requires_grad(&self) -> Tensor {
        let leaf = Leaf {
            grad: Mutex::new(GradSlot::default()),
        };
        self.with_attachment(Some(Arc::new(Meta::Leaf(Arc::new(leaf)))))
    }

    /// Whether backward will reach this tensor.
    pub fn needs_grad(&self) -> bool {
        meta(self).is_some()
    }

    /// The same values, cut from the graph.
    pub fn detach(&self) -> Tensor {
        self.with_attachment(None)
    }

    /// The gradient of a leaf (None before the first backward, after `zero_grad`, or for a
    /// tensor that is not a leaf).
    pub fn grad(&self) -> Option<Tensor> {
        match meta(self)? {
            Meta::Leaf(l) => {
                let slot = l.grad.lock().unwrap_or_else(|e| e.into_inner());
                if slot.stale {
                    None
                } else {
                    slot.grad.clone()
                }
            }
            _ => None,
        }
    }

    /// Gives a leaf the buffer its gradient is written to (a view into a flat gradient chunk,
    /// so the optimizer updates every parameter in one dispatch); marked zero.
    pub(crate) fn set_grad_buffer(&self, buf: Tensor) {
        if let Some(Meta::Leaf(l)) = meta(self) {
            let mut slot = l.grad.lock().unwrap_or_else(|e| e.into_inner());
            slot.grad = Some(buf);
            slot.stale = true;
        }
    }

    /// The buffer a leaf's gradient is written to, stale or not.
    pub(crate) fn grad_buffer(&self) -> Option<Tensor> {
        match meta(self)? {
            Meta::Leaf(l) => l
                .grad
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .grad
                .clone(),
            _ => None,
        }
    }

    /// Whether a leaf's gradient is logically zero (no backward wrote it since `zero_grad`).
    pub(crate) fn grad_is_stale(&self) -> bool {
        match meta(self) {
            Some(Meta::Leaf(l)) => l.grad.lock().unwrap_or_else(|e| e.into_inner()).stale,
            _ => false,
        }
    }

    /// Marks the gradient as zero without a dispatch: the next backward overwrites the buffer.
    pub fn zero_grad(&self) {
        if let Some(Meta::Leaf(l)) = meta(self) {
            l.grad.lock().unwrap_or_else(|e| e.into_inner()).stale = true;
        }
    }

    /// Backward from a one-element tensor (seed 1).
    pub fn backward(&self) -> Result<()> {
        if self.numel() != 1 {
            return Err(Error::InvalidArgument {
                op: "backward",
                reason: format!(
                    "backward without a seed gradient needs a one-element tensor, got shape {:?}; use backward_with",
                    self.shape()
                ),
            });
        }
        let seed = Tensor::ones(self.device(), self.shape())?;
        self.backward_with(&seed)
    }

    /// Backward with `seed` as the gradient of this tensor.
    pub fn backward_with(&self, seed: &Tensor) -> Result<()> {
        backward::run(self, seed)
    }
}
