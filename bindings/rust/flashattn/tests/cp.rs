//! libflashattn_cp through the safe API (feature "cp"): the loopback ring on the CPU backend for
//! W = 1..4, causal zigzag and non-causal, GQA, against a float64 reference written here; errors.
use flashattn::cp::{shard_rows, CpPlan};
use flashattn::*;

fn rand(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((*seed >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0) as f32
        })
        .collect()
}

/// O [s][hq][d] and LSE [hq][s] of one sequence (batch 1), float64.
fn reference(q: &[f32], k: &[f32], v: &[f32], s: usize, hq: usize, hkv: usize, d: usize, causal: bool)
             -> (Vec<f64>, Vec<f64>) {
    let (mut o, mut lse) = (vec![0f64; s * hq * d], vec![0f64; hq * s]);
    let scale = 1.0 / (d as f64).sqrt();
    for h in 0..hq {
        let g = h / (hq / hkv);
        for i in 0..s {
            let last = if causal { i } else { s - 1 };
            let scores: Vec<f64> = (0..=last)
                .map(|j| (0..d).map(|x| q[(i * hq + h) * d + x] as f64 * k[(j * hkv + g) * d + x] as f64).sum::<f64>() * scale)
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = scores.iter().map(|x| (x - m).exp()).sum();
            for x in 0..d {
                o[(i * hq + h) * d + x] =
                    (0..=last).map(|j| (scores[j] - m).exp() * v[(j * hkv + g) * d + x] as f64).sum::<f64>() / sum;
            }
            lse[h * s + i] = m + sum.ln();
        }
    }
    (o, lse)
}

fn local_plan(rows: usize, hq: usize, hkv: usize, d: usize, causal: bool) -> Plan {
    let mut p = Plan::with(&[
        (I64Param::Batch, 1), (I64Param::SeqlenQ, rows as i64), (I64Param::SeqlenK, rows as i64),
        (I64Param::HeadsQ, hq as i64), (I64Param::HeadsKv, hkv as i64), (I64Param::HeadDim, d as i64),
        (I64Param::Dtype, 3), (I64Param::Backend, 1), (I64Param::Causal, causal as i64),
    ])
    .unwrap();
    p.finalize().unwrap();
    p
}

#[test]
fn loopback_ring_matches_the_reference() {
    let (hq, hkv, d, l) = (4, 2, 16, 6);
    let mut seed = 7u64;
    for world in 1..=4 {
        for causal in [false, true] {
            let s = world * l;
            let (q, k, v) = (rand(s * hq * d, &mut seed), rand(s * hkv * d, &mut seed), rand(s * hkv * d, &mut seed));
            let local = local_plan(l, hq, hkv, d, causal);
            let ring = CpPlan::loopback(&local, world).unwrap();
            assert_eq!(ring.local_ranks(), world);
            let gather = |x: &[f32], heads: usize, r: usize| -> Vec<f32> {
                shard_rows(world, r, l, causal).iter().flat_map(|&g| x[g * heads * d..(g + 1) * heads * d].to_vec()).collect()
            };
            let qs: Vec<Vec<f32>> = (0..world).map(|r| gather(&q, hq, r)).collect();
            let ks: Vec<Vec<f32>> = (0..world).map(|r| gather(&k, hkv, r)).collect();
            let vs: Vec<Vec<f32>> = (0..world).map(|r| gather(&v, hkv, r)).collect();
            let mut os = vec![vec![f32::NAN; l * hq * d]; world];
            let mut ls = vec![vec![f32::NAN; hq * l]; world];
            {
                let q_refs: Vec<&[f32]> = qs.iter().map(|x| x.as_slice()).collect();
                let k_refs: Vec<&[f32]> = ks.iter().map(|x| x.as_slice()).collect();
                let v_refs: Vec<&[f32]> = vs.iter().map(|x| x.as_slice()).collect();
                let mut o_refs: Vec<&mut [f32]> = os.iter_mut().map(|x| x.as_mut_slice()).collect();
                let mut l_refs: Vec<&mut [f32]> = ls.iter_mut().map(|x| x.as_mut_slice()).collect();
                ring.execute_host(&q_refs, &k_refs, &v_refs, &mut o_refs, Some(&mut l_refs)).unwrap();
            }
            let (o_ref, lse_ref) = reference(&q, &k, &v, s, hq, hkv, d, causal);
            let mut worst = 0f64;
            for r in 0..world {
                for (i, &g) in shard_rows(world, r, l, causal).iter().enumerate() {
                    for x in 0..hq * d {
                        worst = worst.max((os[r][i * hq * d + x] as f64 - o_ref[g * hq * d + x]).abs());
                    }
                    for h in 0..hq {
                        worst = worst.max((ls[r][h * l + i] as f64 - lse_ref[h * s + g]).abs());
                    }
                }
            }
            assert!(worst <= 2e-5, "W={world} causal={causal}: max error {worst}");
        }
    }
}

#[test]
fn errors_carry_the_component_message() {
    let odd = local_plan(3, 2, 2, 16, true);
    let err = CpPlan::loopback(&odd, 2).err().expect("odd L with causal must be refused");
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("odd"), "{}", err.message);
    let even = local_plan(4, 2, 2, 16, true);
    assert_eq!(CpPlan::loopback(&even, 0).err().unwrap().status, Status::InvalidArgument);
    let ring = CpPlan::loopback(&even, 2).unwrap();
    let one = vec![0f32; 4 * 2 * 16];
    let mut out = vec![0f32; 4 * 2 * 16];
    let err = ring.execute_host(&[&one[..]], &[&one[..]], &[&one[..]], &mut [&mut out[..]], None).unwrap_err();
    assert!(err.message.contains("rank"), "{}", err.message);
    assert_eq!(shard_rows(2, 0, 4, true), vec![0, 1, 6, 7]);
    assert_eq!(shard_rows(2, 1, 4, false), vec![4, 5, 6, 7]);
}
