//! Shape, strides and offset of a tensor view; every view op (reshape, permute, slice,
//! broadcast) is a new Layout over the same storage.

use crate::error::{Error, Result};

/// Dims a kernel can index (the params structs hold 8).
pub const MAX_RANK: usize = 8;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub shape: Vec<usize>,
    /// In elements; 0 on broadcast dims.
    pub strides: Vec<usize>,
    /// In elements, from the start of the storage.
    pub offset: usize,
}

pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

/// A dim that may count from the end (-1 is the last), checked against `rank`.
pub fn resolve_dim(op: &'static str, dim: isize, rank: usize) -> Result<usize> {
    let d = if dim < 0 { dim + rank as isize } else { dim };
    if d < 0 || d as usize >= rank {
        return Err(Error::DimOutOfRange { op, dim, rank });
    }
    Ok(d as usize)
}

/// The shape two shapes broadcast to (numpy rules).
pub fn broadcast_shape(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::BroadcastMismatch {
                    op,
                    lhs: a.to_vec(),
                    rhs: b.to_vec(),
                })
            }
        };
    }
    Ok(out)
}

impl Layout {
    pub fn contiguous(shape: &[usize]) -> Layout {
        Layout {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Row-major with no gaps (dims of size 1 may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for (&n, &s) in self.shape.iter().zip(&self.strides).rev() {
            if n != 1 && s != expected {
                return false;
            }
            expected *= n;
        }
        true
    }

    /// One past the largest element offset this view reads (0 when empty).
    pub fn storage_extent(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        self.offset
            + 1
            + self
                .shape
                .iter()
                .zip(&self.strides)
                .map(|(n, s)| (n - 1) * s)
                .sum::<usize>()
    }

    /// The same elements with shape `shape`, without a copy when the layout allows it.
    pub fn reshape(&self, shape: &[usize]) -> Option<Layout> {
        if self.is_contiguous() {
            return Some(Layout {
                shape: shape.to_vec(),
                strides: contiguous_strides(shape),
                offset: self.offset,
            });
        }
        None
    }

    pub fn permute(&self, dims: &[usize]) -> Layout {
        Layout {
            shape: dims.iter().map(|&d| self.shape[d]).collect(),
            strides: dims.iter().map(|&d| self.strides[d]).collect(),
            offset: self.offset,
        }
    }

    /// A size-1 dim inserted at `d` (0..=rank).
    pub fn unsqueeze(&self, d: usize) -> Layout {
        let mut l = self.clone();
        let stride = if d < l.rank() {
            l.strides[d] * l.shape[d]
        } else {
            1
        };
        l.shape.insert(d, 1);
        l.strides.insert(d, stride);
        l
    }

    /// The size-1 dim `d` removed (the caller checked its size).
    pub fn squeeze(&self, d: usize) -> Layout {
        let mut l = self.clone();
        l.shape.remove(d);
        l.strides.remove(d);
        l
    }

    /// `len` entries from `start` along `dim`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Layout {
        let mut l = self.clone();
        l.offset += start * self.strides[dim];
        l.shape[dim] = len;
        l
    }

    /// This view seen with shape `shape` (numpy broadcasting: new leading dims and size-1
    /// dims get stride 0). The caller has checked that the shapes broadcast.
    pub fn broadcast_to(&self, shape: &[usize]) -> Layout {
        let extra = shape.len() - self.rank();
        let mut strides = vec![0; shape.len()];
        for (i, s) in strides.iter_mut().enumerate().skip(extra) {
            let d = i - extra;
            *s = if self.shape[d] == 1 && shape[i] != 1 {
                0
            } else {
                self.strides[d]
            };
        }
        Layout {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        }
    }

    /// Merges neighbouring dims that are contiguous with each other: fewer dims for kernels
    /// to decompose, and rank above MAX_RANK only when the view really needs it.
    pub fn coalesced(&self) -> Layout {
        let (shape, mut strides) = coalesce_joint(&self.shape, &[&self.strides]);
        Layout {
            shape,
            strides: strides.pop().expect("one operand in, one out"),
            offset: self.offset,
        }
    }
}

/// Shapes and strides of several operands over one output shape, with neighbouring dims merged
/// where every operand allows it. Returns (shape, strides per operand).
pub fn coalesce_joint(shape: &[usize], strides: &[&[usize]]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut out_shape: Vec<usize> = Vec::new();
    let mut out_strides: Vec<Vec<usize>> = vec![Vec::new(); strides.len()];
    for d in 0..shape.len() {
        let n = shape[d];
        if n == 1 {
            continue;
        }
        let mergeable = !out_shape.is_empty()
            && strides
                .iter()
                .zip(&out_strides)
                .all(|(s, os)| *os.last().expect("same length as out_shape") == s[d] * n);
        if mergeable {
            *out_shape.last_mut().expect("checked non-empty") *= n;
            for (s, os) in strides.iter().zip(out_strides.iter_mut()) {
                *os.last_mut().expect("checked non-empty") = s[d];
            }
        } else {
            out_shape.push(n);
            for (s, os) in strides.iter().zip(out_strides.iter_mut()) {
                os.push(s[d]);
            }
        }
    }
    (out_shape, out_strides)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(
            broadcast_shape("t", &[2, 1, 3], &[4, 1]).unwrap(),
            vec![2, 4, 3]
        );
        assert_eq!(broadcast_shape("t", &[], &[5]).unwrap(), vec![5]);
        assert!(broadcast_shape("t", &[2, 3], &[4]).is_err());
    }

    #[test]
    fn coalescing_merges_only_contiguous_runs() {
        let l = Layout::contiguous(&[2, 3, 4]);
        assert_eq!(l.coalesced().shape, vec![24]);
        let t = l.permute(&[0, 2, 1]);
        assert_eq!(t.coalesced().shape, vec![2, 4, 3]);
        let (s, st) = coalesce_joint(&[2, 3, 4], &[&[12, 4, 1], &[0, 4, 1]]);
        assert_eq!(s, vec![2, 12]);
        assert_eq!(st, vec![vec![12, 1], vec![0, 1]]);
    }

    #[test]
    fn narrow_and_extent() {
        let l = Layout::contiguous(&[4, 5]).narrow(1, 2, 3);
        assert_eq!(l.offset, 2);
        assert!(!l.is_contiguous());
        assert_eq!(l.storage_extent(), 2 + 1 + 3 * 5 + 2);
    }
}
