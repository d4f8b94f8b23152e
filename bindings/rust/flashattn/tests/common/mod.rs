//! Helpers shared by the integration tests (each test file is its own crate: `mod common;`).
#![allow(dead_code)]
use flashattn::{Options, Shape};

pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

/// The softmax scale of `o` for head dimension `s.head_dim`.
pub fn scale(s: &Shape, o: &Options) -> f64 {
    o.scale.unwrap_or(1.0 / (s.head_dim as f64).sqrt())
}

/// Row `i` of the float64 scores scale·q·kᵀ through the softcap, of query head `h` (kv head `hk`)
/// in batch `bi` on contiguous tensors: (scores, -inf where masked; each key's tanh(score/softcap),
/// 0 without a softcap).
#[allow(clippy::too_many_arguments)]
pub fn score_row(q: &[f32], k: &[f32], s: &Shape, o: &Options, bi: usize, h: usize, hk: usize, i: usize)
                 -> (Vec<f64>, Vec<f64>) {
    let (sq, sk, hq, hkv, d) = (s.seqlen_q, s.seqlen_k, s.heads_q, s.heads_kv, s.head_dim);
    let scale = scale(s, o);
    let diag = i as i64 + sk as i64 - sq as i64;
    let mut scores = vec![f64::NEG_INFINITY; sk];
    let mut tanhs = vec![0f64; sk];
    for j in 0..sk {
        let j64 = j as i64;
        if (o.causal && j64 > diag) || (o.window.0 >= 0 && j64 < diag - o.window.0)
            || (o.window.1 >= 0 && j64 > diag + o.window.1) {
            continue;
        }
        let mut dot = 0f64;
        for x in 0..d {
            dot += q[((bi * sq + i) * hq + h) * d + x] as f64 * k[((bi * sk + j) * hkv + hk) * d + x] as f64;
        }
        let mut val = dot * scale;
        if o.softcap > 0.0 {
            tanhs[j] = (val / o.softcap).tanh();
            val = o.softcap * tanhs[j];
        }
        scores[j] = val;
    }
    (scores, tanhs)
}
