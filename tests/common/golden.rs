//! A golden fixture's `expected.safetensors` (made by tests/fixtures/make_*_fixtures.py): its
//! f32 tensors as f64 and its `input_ids`.

use std::path::Path;

use safetensors::SafeTensors;

pub struct Expected {
    bytes: Vec<u8>,
}

impl Expected {
    /// `dir`/expected.safetensors.
    pub fn load(dir: &Path) -> Expected {
        Expected {
            bytes: std::fs::read(dir.join("expected.safetensors")).expect("the fixture file"),
        }
    }

    pub fn f32s(&self, name: &str) -> Vec<f64> {
        let st = SafeTensors::deserialize(&self.bytes).expect("a safetensors file");
        let t = st
            .tensor(name)
            .unwrap_or_else(|_| panic!("fixture tensor {name}"));
        t.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
            .collect()
    }

    pub fn ids(&self) -> Vec<u32> {
        let st = SafeTensors::deserialize(&self.bytes).expect("a safetensors file");
        let t = st.tensor("input_ids").expect("input_ids");
        t.data()
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u32)
            .collect()
    }
}
