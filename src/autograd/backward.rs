//! The backward traversal and the context a rule writes its input gradients through.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::Arc;

use super::{meta, no_grad, Meta, Node};
use crate::error::{Error, Result};
use crate::graph::{DType, Layout, Phase, Tensor};
use crate::ops::Out;

/// Gradients of non-leaf tensors during one traversal, by node id; `owned` says the buffer was
/// made for this gradient alone (so later contributions may be added into it in place).
#[derive(Default)]
struct GradStore {
    grads: HashMap<u64, (Tensor, bool)>,
    /// How many inputs of the traversal's nodes each node is (a view counting for its base):
    /// the contributions its gradient will get.
    consumers: Consumers,
}

/// What a rule sees: its inputs, and where each input's gradient goes.
pub(crate) struct BackwardCtx<'a> {
    inputs: &'a [Tensor],
    store: &'a mut GradStore,
}

/// How a target buffer is written.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Write,
    Acc,
}

impl BackwardCtx<'_> {
    pub(crate) fn input(&self, i: usize) -> &Tensor {
        &self.inputs[i]
    }

    /// Whether input `i` wants a gradient.
    pub(crate) fn needed(&self, i: usize) -> bool {
        meta(&self.inputs[i]).is_some()
    }

    /// Computes input `i`'s gradient contribution with `f`, which writes it per the target it
    /// is given (a new tensor, or an existing gradient buffer to overwrite or add into).
    pub(crate) fn put_with(
        &mut self,
        i: usize,
        f: impl FnOnce(Out<'_>) -> Result<Tensor>,
    ) -> Result<()> {
        put_into(self.store, &self.inputs[i], DType::F32, |out, _| f(out))
    }

    /// `put_with` where a first contribution through a view that covers its base makes the
    /// base's gradient buffer of `dtype` (f16: a gradient whose producer reads f16,
    /// `input_takes_half`) instead of f32; `f` sees the target's type.
    pub(crate) fn put_with_typed(
        &mut self,
        i: usize,
        dtype: DType,
        f: impl FnOnce(Out<'_>) -> Result<Tensor>,
    ) -> Result<()> {
        put_into(self.store, &self.inputs[i], dtype, |out, _| f(out))
    }

    /// Whether this rule's contribution to input `i`'s gradient is the only one it gets: the
    /// node that made it (or, for a view, its base) is an input of this traversal's nodes once.
    pub(crate) fn sole_contribution(&self, i: usize) -> bool {
        node_of(&self.inputs[i])
            .is_some_and(|n| self.store.consumers.get(&n.id).copied() == Some(1))
    }

    /// Whether the rule that made input `i` (or, for a view, its base) reads its gradient as
    /// f16 too (`Backward::takes_half_grad`); false for a leaf or an input no op made.
    pub(crate) fn input_takes_half(&self, i: usize) -> bool {
        node_of(&self.inputs[i]).is_some_and(|n| n.takes_half)
    }

    /// Inputs `i` and `j`, both wanting a gradient, get their contributions from one `f` (one
    /// kernel writing two gradients), which is handed both targets at once and returns
    /// (i's, j's). Where the two gradients belong to the same leaf, node or view base, a
    /// target of one may depend on the other having been written (the first contribution to
    /// a leaf makes its buffer): `f` then makes both new and each is put in turn.
    pub(crate) fn put_pair_with(
        &mut self,
        i: usize,
        j: usize,
        f: impl FnOnce(Out<'_>, Out<'_>) -> Result<(Tensor, Tensor)>,
    ) -> Result<()> {
        let (xi, xj) = (&self.inputs[i], &self.inputs[j]);
        if !self.needed(i) || !self.needed(j) {
            return Err(Error::InvalidArgument {
                op: "backward",
                reason: "put_pair_with for an input that wants no gradient (an engine \
                         invariant was broken)"
                    .into(),
            });
        }
        if grad_owner(xi) == grad_owner(xj) {
            let (ti, tj) = f(Out::New, Out::New)?;
            let pass = |t: Tensor| {
                move |out: Out<'_>| match out {
                    Out::New => Ok(t),
                    out => copy_into(&t, out),
                }
            };
            self.put_with(i, pass(ti))?;
            return self.put_with(j, pass(tj));
        }
        put_into(self.store, xi, DType::F32, |out_i, store| {
            let mut ti = None;
            put_into(store, xj, DType::F32, |out_j, _| {
                let (a, b) = f(out_i, out_j)?;
                ti = Some(a);
                Ok(b)
            })?;
            Ok(ti.expect("the pair's closure ran: both inputs want a gradient"))
        })
    }

    /// `put_pair_with` for three inputs `i`, `j`, `k`, all wanting a gradient: one `f` (one
    /// kernel writing three gradients) handed the three targets at once, returning (i's, j's,
    /// k's). Where two of them belong to the same leaf, node or view base, `f` makes all three
    /// new and each is put in turn.
    pub(crate) fn put_triple_with(
        &mut self,
        [i, j, k]: [usize; 3],
        f: impl FnOnce(Out<'_>, Out<'_>, Out<'_>) -> Result<(Tensor, Tensor, Tensor)>,
    ) -> Result<()> {
        let [xi, xj, xk] = [i, j, k].map(|n| &self.inputs[n]);
        if [i, j, k].iter().any(|&n| !self.needed(n)) {
            return Err(Error::InvalidArgument {
                op: "backward",
                reason: "put_triple_with for an input that wants no gradient (an engine \
                         invariant was broken)"
                    .into(),
            });
        }
        let [oi, oj, ok] = [xi, xj, xk].map(grad_owner);
        if oi == oj || oi == ok || oj == ok {
            let (ti, tj, tk) = f(Out::New, Out::New, Out::New)?;
            let pass = |t: Tensor| {
                move |out: Out<'_>| match out {
                    Out::New => Ok(t),
                    out => copy_into(&t, out),
                }
            };
            self.put_with(i, pass(ti))?;
            self.put_with(j, pass(tj))?;
            return self.put_with(k, pass(tk));
        }
        put_into(self.store, xi, DType::F32, |out_i, store| {
            let mut ti = None;
            put_into(store, xj, DType::F32, |out_j, store| {
                let mut tj = None;
                put_into(store, xk, DType::F32, |out_k, _| {
                    let (a, b, c) = f(out_i, out_j, out_k)?;
                    ti = Some(a);
                    tj = Some(b);
                    Ok(c)
                })?;
                Ok(tj.expect("the triple's closure ran: all three inputs want a gradient"))
            })?;
            Ok(ti.expect("the triple's closure ran: all three inputs want a gradient"))
        })
    }

    /// Input `i` (of shape `shape`) gets `f`'s result, computed at the broadcast shape `full`:
    /// written straight into the target when the shapes agree, else made new and summed back
    /// over the broadcast dims into the target.
    pub(crate) fn put_summed_to(
        &mut self,
        i: usize,
        shape: &[usize],
        full: &[usize],
        f: impl FnOnce(Out<'_>) -> Result<Tensor>,
    ) -> Result<()> {
        if shape == full {
            return self.put_with(i, f);
        }
        let full = f(Out::New)?;
        self.put_with(i, |out| full.sum_to_shape_into(shape, out))
    }

    /// Input `i`'s gradient is `t` (a tensor computed elsewhere, e.g. the output gradient
    /// passed through): kept without a copy where nothing else will write into it.
    pub(crate) fn put(&mut self, i: usize, t: Tensor) -> Result<()> {
        if let Some(Meta::Node(node)) = meta(&self.inputs[i]) {
            if let std::collections::hash_map::Entry::Vacant(e) = self.store.grads.entry(node.id) {
                e.insert((t, false));
                return Ok(());
            }
        }
        self.put_with(i, |out| copy_into(&t, out))
    }
}

/// `put_with` on the store: `f` gets the target of `x`'s gradient, and the store (for a
/// nested target). A view's first contribution that covers its base makes the base's buffer
/// of `fresh` (`full_target`).
fn put_into(
    store: &mut GradStore,
    x: &Tensor,
    fresh: DType,
    f: impl FnOnce(Out<'_>, &mut GradStore) -> Result<Tensor>,
) -> Result<()> {
    match meta(x) {
        None => Ok(()),
        Some(Meta::Leaf(leaf)) => {
            let mut slot = leaf.grad.lock().unwrap_or_else(|e| e.into_inner());
            match (slot.grad.clone(), slot.stale) {
                (Some(buf), true) => {
                    f(Out::Write(&buf), store)?;
                }
                (Some(buf), false) => {
                    f(Out::Acc(&buf), store)?;
                }
                (None, _) => {
                    let buf = f(Out::New, store)?;
                    slot.grad = Some(buf.detach());
                }
            }
            slot.stale = false;
            Ok(())
        }
        Some(Meta::Node(node)) => {
            match store.grads.remove(&node.id) {
                None => {
                    let t = f(Out::New, store)?;
                    store.grads.insert(node.id, (t.detach(), true));
                }
                Some((buf, true)) => {
                    f(Out::Acc(&buf), store)?;
                    store.grads.insert(node.id, (buf, true));
                }
                Some((shared, false)) if shared.is_sole_view() && shared.is_contiguous() => {
                    // Borrowed (passed through from another tensor's gradient, like a
                    // residual's), but every other view of it is gone, so every reader of
                    // it has been recorded: add into it in place (no sum, no new buffer).
                    f(Out::Acc(&shared), store)?;
                    store.grads.insert(node.id, (shared, true));
                }
                Some((shared, false)) => {
                    // The gradient so far is borrowed and still read elsewhere: sum into a
                    // new one.
                    let t = f(Out::New, store)?;
                    let sum = shared.add(&t)?;
                    store.grads.insert(node.id, (sum, true));
                }
            }
            Ok(())
        }
        Some(Meta::View { base, rel }) => {
            let covers = x.numel() == base.numel();
            let (buf, mode) = full_target(store, base, covers, fresh)?;
            if !buf.is_contiguous() {
                return Err(Error::InvalidArgument {
                    op: "backward",
                    reason: "a gradient buffer is not row-major (an engine invariant was broken)"
                        .into(),
                });
            }
            let view = buf.with_layout(Layout {
                shape: rel.shape.clone(),
                strides: rel.strides.clone(),
                offset: buf.layout().offset + rel.offset,
            });
            match mode {
                Mode::Write => f(Out::Write(&view), store)?,
                Mode::Acc => f(Out::Acc(&view), store)?,
            };
            Ok(())
        }
    }
}

/// What a tensor's gradient is part of: its leaf, node, or (for a view) its base's.
fn grad_owner(t: &Tensor) -> Option<usize> {
    match meta(t)? {
        Meta::Leaf(leaf) => Some(Arc::as_ptr(leaf) as *const () as usize),
        Meta::Node(node) => Some(Arc::as_ptr(node) as *const () as usize),
        Meta::View { base, .. } => grad_owner(base),
    }
}

/// The whole gradient buffer of `base` (a leaf or node) for a view's contribution: made on
/// first use (zeroed unless the view covers it; of `dtype` where it covers a node, else f32),
/// owned, in place.
fn full_target(
    store: &mut GradStore,
    base: &Tensor,
    covers: bool,
    dtype: DType,
) -> Result<(Tensor, Mode)> {
    let node = matches!(meta(base), Some(Meta::Node(_)));
    let fresh = |covers: bool| -> Result<(Tensor, Mode)> {
        if covers {
            let dtype = if node { dtype } else { DType::F32 };
            Ok((
                Tensor::uninit(base.device(), base.shape(), dtype, "backward")?,
                Mode::Write,
            ))
        } else {
            Ok((Tensor::zeros(base.device(), base.shape())?, Mode::Acc))
        }
    };
    match meta(base) {
        Some(Meta::Leaf(leaf)) => {
            let mut slot = leaf.grad.lock().unwrap_or_else(|e| e.into_inner());
            let out = match (slot.grad.clone(), slot.stale) {
                (Some(buf), false) => (buf, Mode::Acc),
                (Some(buf), true) if covers => (buf, Mode::Write),
                (Some(buf), true) => {
                    buf.fill_(0.0)?;
                    (buf, Mode::Acc)
                }
                (None, _) => {
                    let (buf, mode) = fresh(covers)?;
                    slot.grad = Some(buf.clone());
                    (buf, mode)
                }
            };
            slot.stale = false;
            Ok(out)
        }
        Some(Meta::Node(node)) => {
            let out = match store.grads.remove(&node.id) {
                Some((buf, true)) => (buf, Mode::Acc),
                Some((shared, false)) => (copy_into(&shared, Out::New)?, Mode::Acc),
                None => fresh(covers)?,
            };
            store.grads.insert(node.id, (out.0.clone(), true));
            Ok(out)
        }
        _ => Err(Error::InvalidArgument {
            op: "backward",
            reason: "a view's base is itself a view (an engine invariant was broken)".into(),
        }),
    }
}

/// `t` copied per `out` (a new tensor, or over / added into an existing one).
fn copy_into(t: &Tensor, out: Out<'_>) -> Result<Tensor> {
    crate::ops::launch_copy(t, out)
}

fn node_of(t: &Tensor) -> Option<Arc<Node>> {
    match meta(t)? {
        Meta::Node(n) => Some(n.clone()),
        Meta::View { base, .. } => node_of(base),
        Meta::Leaf(_) => None,
    }
}

/// How many inputs of a traversal's nodes each node (by id) is.
type Consumers = HashMap<u64, usize>;

/// Nodes reachable from `root`, each after every node that consumes it (root first), and how
/// many inputs of those nodes each node is.
fn reverse_topological(root: &Tensor) -> Result<(Vec<Arc<Node>>, Consumers)> {
    let mut order = Vec::new();
    let mut seen = HashSet::default();
    let mut consumers = Consumers::default();
    let Some(start) = node_of(root) else {
        return Ok((order, consumers));
    };
    // Iterative post-order DFS (graphs are deep: one node per op of a whole model).
    let mut stack: Vec<(Arc<Node>, Vec<Arc<Node>>)> = Vec::new();
    let children = |n: &Arc<Node>| -> Result<Vec<Arc<Node>>> {
        let inputs = n.inputs.lock().unwrap_or_else(|e| e.into_inner());
        if n.rule.lock().unwrap_or_else(|e| e.into_inner()).is_none() {
            return Err(Error::InvalidArgument {
                op: "backward",
                reason: format!(
                    "the graph through `{}` was released by an earlier backward; run the forward pass again",
                    n.name
                ),
            });
        }
        Ok(inputs.iter().filter_map(node_of).collect())
    };
    seen.insert(start.id);
    let kids = children(&start)?;
    stack.push((start, kids));
    while let Some((node, kids)) = stack.last_mut() {
        if let Some(kid) = kids.pop() {
            *consumers.entry(kid.id).or_default() += 1;
            if seen.insert(kid.id) {
                let grandkids = children(&kid)?;
                stack.push((kid, grandkids));
            }
        } else {
            order.push(node.clone());
            stack.pop();
        }
    }
    order.reverse();
    Ok((order, consumers))
}

pub(super) fn run(root: &Tensor, seed: &Tensor) -> Result<()> {
    if meta(root).is_none() {
        return Err(Error::InvalidArgument {
            op: "backward",
            reason:
                "the tensor does not require grad (none of its inputs was made with requires_grad)"
                    .into(),
        });
    }
    if seed.shape() != root.shape() {
        return Err(Error::ShapeMismatch {
            op: "backward",
            expected: format!("a seed gradient of shape {:?}", root.shape()),
            got: seed.shape().to_vec(),
        });
    }
    let device = root.device().clone();
    let previous = device.set_phase(Phase::Backward);
    let result = no_grad(|| traverse(root, seed));
    device.set_phase(previous);
    result
}

fn traverse(root: &Tensor, seed: &Tensor) -> Result<()> {
    let (order, consumers) = reverse_topological(root)?;
    let mut store = GradStore {
        consumers,
        ..Default::default()
    };
    let roots = [root.clone()];
    BackwardCtx {
        inputs: &roots,
        store: &mut store,
    }
    .put(0, seed.clone())?;
    for node in order {
        let Some((g, _)) = store.grads.remove(&node.id) else {
            continue; // no gradient reached this node
        };
        let rule = node.rule.lock().unwrap_or_else(|e| e.into_inner()).take();
        let inputs = std::mem::take(&mut *node.inputs.lock().unwrap_or_else(|e| e.into_inner()));
        let Some(rule) = rule else {
            return Err(Error::InvalidArgument {
                op: "backward",
                reason: format!("the graph through `{}` was already released", node.name),
            });
        };
        let mut ctx = BackwardCtx {
            inputs: &inputs,
            store: &mut store,
        };
        tracing::trace!(node = node.name, "backward");
        rule.backward(&g, &mut ctx)?;
        // The rule's saved state, the inputs and g are released here.
    }
    Ok(())
}
