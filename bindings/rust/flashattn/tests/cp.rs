//! libflashattn_cp through the safe API (feature "cp"): the loopback ring on the CPU backend for
//! W = 1..4, causal zigzag and non-causal, GQA, against a float64 reference written here; its
//! backward pass (W = 1..3) against the core library's single-call backward on the gathered
//! sequence; errors.
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

fn slices(x: &[Vec<f32>]) -> Vec<&[f32]> {
    x.iter().map(|x| x.as_slice()).collect()
}

/// Rank r's rows of a global [s][heads][d] tensor, in its local order.
fn shard(x: &[f32], world: usize, r: usize, l: usize, heads: usize, d: usize, causal: bool) -> Vec<f32> {
    shard_rows(world, r, l, causal).iter().flat_map(|&g| x[g * heads * d..(g + 1) * heads * d].to_vec()).collect()
}

/// The ring's forward and backward on every rank's shards of q, k, v, dout: (dq, dk, dv) per rank.
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
fn ring_backward(ring: &CpPlan, qs: &[Vec<f32>], ks: &[Vec<f32>], vs: &[Vec<f32>], douts: &[Vec<f32>], l: usize,
                 hq: usize, hkv: usize, d: usize) -> (Vec<Vec<f32>>, Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let world = qs.len();
    let refs = slices;
    let mut os = vec![vec![f32::NAN; l * hq * d]; world];
    let mut ls = vec![vec![f32::NAN; hq * l]; world];
    {
        let mut o_refs: Vec<&mut [f32]> = os.iter_mut().map(|x| x.as_mut_slice()).collect();
        let mut l_refs: Vec<&mut [f32]> = ls.iter_mut().map(|x| x.as_mut_slice()).collect();
        ring.execute_host(&refs(qs), &refs(ks), &refs(vs), &mut o_refs, Some(&mut l_refs)).unwrap();
    }
    let mut dqs = vec![vec![f32::NAN; l * hq * d]; world];
    let mut dks = vec![vec![f32::NAN; l * hkv * d]; world];
    let mut dvs = vec![vec![f32::NAN; l * hkv * d]; world];
    {
        let mut dq: Vec<&mut [f32]> = dqs.iter_mut().map(|x| x.as_mut_slice()).collect();
        let mut dk: Vec<&mut [f32]> = dks.iter_mut().map(|x| x.as_mut_slice()).collect();
        let mut dv: Vec<&mut [f32]> = dvs.iter_mut().map(|x| x.as_mut_slice()).collect();
        ring.execute_backward_host(&refs(qs), &refs(ks), &refs(vs), &refs(&os), &refs(douts), &refs(&ls), &mut dq,
                                   &mut dk, &mut dv)
            .unwrap();
    }
    (dqs, dks, dvs)
}

#[test]
fn loopback_ring_backward_matches_one_call() {
    let (hq, hkv, d, l) = (4, 2, 16, 6);
    let mut seed = 19u64;
    for world in 1..=3 {
        for causal in [false, true] {
            let s = world * l;
            let (q, k, v) = (rand(s * hq * d, &mut seed), rand(s * hkv * d, &mut seed), rand(s * hkv * d, &mut seed));
            let dout = rand(s * hq * d, &mut seed);
            let ring = CpPlan::loopback(&local_plan(l, hq, hkv, d, causal), world).unwrap();
            assert!(ring.backward_workspace_size().unwrap() > 0);
            let shards = |x: &[f32], heads: usize| (0..world).map(|r| shard(x, world, r, l, heads, d, causal)).collect::<Vec<_>>();
            let (qs, ks, vs, douts) = (shards(&q, hq), shards(&k, hkv), shards(&v, hkv), shards(&dout, hq));
            let (dqs, dks, dvs) = ring_backward(&ring, &qs, &ks, &vs, &douts, l, hq, hkv, d);
            // The core library's single call on the gathered sequence: forward, then backward.
            let whole = local_plan(s, hq, hkv, d, causal);
            let (mut o, mut lse) = (vec![0f32; s * hq * d], vec![0f32; hq * s]);
            whole.execute(&q, &k, &v, &mut o, Some(&mut lse), None).unwrap();
            let (mut dq, mut dk, mut dv) = (vec![0f32; s * hq * d], vec![0f32; s * hkv * d], vec![0f32; s * hkv * d]);
            whole.backward(&q, &k, &v, &o, &dout, &lse, &mut dq, &mut dk, &mut dv, None).unwrap();
            let mut worst = 0f64;
            for r in 0..world {
                for (i, &g) in shard_rows(world, r, l, causal).iter().enumerate() {
                    for (got, one, heads) in [(&dqs[r], &dq, hq), (&dks[r], &dk, hkv), (&dvs[r], &dv, hkv)] {
                        for x in 0..heads * d {
                            let e = (got[i * heads * d + x] as f64 - one[g * heads * d + x] as f64).abs();
                            worst = if e.is_nan() { f64::INFINITY } else { worst.max(e) }; // NaN: not written
                        }
                    }
                }
            }
            assert!(worst <= 1e-4, "W={world} causal={causal}: max |ring - one call| {worst}");
            // On the CPU the ring adds in a fixed order: a second run is bitwise identical.
            let again = ring_backward(&ring, &qs, &ks, &vs, &douts, l, hq, hkv, d);
            for (a, b) in [(&dqs, &again.0), (&dks, &again.1), (&dvs, &again.2)] {
                for (x, y) in a.iter().zip(b.iter()) {
                    assert!(x.iter().zip(y.iter()).all(|(p, q)| p.to_bits() == q.to_bits()), "W={world}: not bitwise");
                }
            }
        }
    }
}

#[test]
fn backward_errors() {
    let (hq, hkv, d, l, world) = (4, 2, 16, 4, 2);
    let ring = CpPlan::loopback(&local_plan(l, hq, hkv, d, true), world).unwrap();
    let mut seed = 5u64;
    let qs: Vec<Vec<f32>> = (0..world).map(|_| rand(l * hq * d, &mut seed)).collect();
    let kvs: Vec<Vec<f32>> = (0..world).map(|_| rand(l * hkv * d, &mut seed)).collect();
    let lses: Vec<Vec<f32>> = (0..world).map(|_| vec![0f32; hq * l]).collect();
    let mut dqs = vec![vec![f32::NAN; l * hq * d]; world];
    let mut dks = vec![vec![f32::NAN; l * hkv * d]; world];
    let mut dvs = vec![vec![f32::NAN; l * hkv * d]; world];
    let p = |x: &[Vec<f32>]| x.iter().map(|x| x.as_ptr() as *const std::ffi::c_void).collect::<Vec<_>>();
    let pm = |x: &mut [Vec<f32>]| x.iter_mut().map(|x| x.as_mut_ptr() as *mut std::ffi::c_void).collect::<Vec<_>>();
    let lp: Vec<*const f32> = lses.iter().map(|x| x.as_ptr()).collect();
    let need = ring.backward_workspace_size().unwrap();
    let mut ws = Workspace::new(need);
    let (dqp, dkp, dvp) = (pm(&mut dqs), pm(&mut dks), pm(&mut dvs));
    let err = unsafe {
        ring.execute_backward_raw(&p(&qs), &p(&kvs), &p(&kvs), &p(&qs), &p(&qs), &lp, &dqp, &dkp, &dvp,
                                  ws.as_mut_ptr(), need - 1, std::ptr::null_mut())
    }
    .unwrap_err();
    assert_eq!(err.status, Status::InsufficientWorkspace, "{}", err.message);
    assert!(!err.message.is_empty());
    // A NULL LSE entry: the C call refuses it.
    let null_lse = vec![lp[0], std::ptr::null()];
    let err = unsafe {
        ring.execute_backward_raw(&p(&qs), &p(&kvs), &p(&kvs), &p(&qs), &p(&qs), &null_lse, &dqp, &dkp, &dvp,
                                  ws.as_mut_ptr(), need, std::ptr::null_mut())
    }
    .unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{}", err.message);
    // An error leaves the outputs untouched.
    assert!(dqs.iter().chain(dks.iter()).chain(dvs.iter()).all(|x| x.iter().all(|v| v.is_nan())));
    // Pointer arrays of the wrong length, and short host slices, are refused here.
    let err = unsafe {
        ring.execute_backward_raw(&p(&qs[..1]), &p(&kvs), &p(&kvs), &p(&qs), &p(&qs), &lp, &dqp, &dkp, &dvp,
                                  ws.as_mut_ptr(), need, std::ptr::null_mut())
    }
    .unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    let refs = slices;
    let short = [0f32; 8];
    let mut dq: Vec<&mut [f32]> = dqs.iter_mut().map(|x| x.as_mut_slice()).collect();
    let mut dk: Vec<&mut [f32]> = dks.iter_mut().map(|x| x.as_mut_slice()).collect();
    let mut dv: Vec<&mut [f32]> = dvs.iter_mut().map(|x| x.as_mut_slice()).collect();
    let err = ring
        .execute_backward_host(&refs(&qs), &refs(&kvs), &refs(&kvs), &refs(&qs), &refs(&qs), &[&lses[0][..], &short[..]],
                               &mut dq, &mut dk, &mut dv)
        .unwrap_err();
    assert!(err.message.contains("lse[1]"), "{}", err.message);
    let err = ring
        .execute_backward_host(&refs(&qs[..1]), &refs(&kvs), &refs(&kvs), &refs(&qs), &refs(&qs), &refs(&lses),
                               &mut dq, &mut dk, &mut dv)
        .unwrap_err();
    assert!(err.message.contains("rank"), "{}", err.message);
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
    // Slices of another dtype than the plan's are refused before the library could read past them.
    let half = vec![F16(0); 4 * 2 * 16];
    let mut half_out = vec![F16(0); 4 * 2 * 16];
    let two = [&half[..], &half[..]];
    let err = ring.execute_host(&two, &two, &two, &mut [&mut half_out[..], &mut vec![F16(0); 4 * 2 * 16][..]], None)
        .unwrap_err();
    assert!(err.message.contains("dtype"), "{}", err.message);
    let lse = vec![0f32; 2 * 4];
    let lses = [&lse[..], &lse[..]];
    let (mut a, mut b, mut c, mut d2, mut e2, mut f) =
        (half.clone(), half.clone(), half.clone(), half.clone(), half.clone(), half.clone());
    let err = ring
        .execute_backward_host(&two, &two, &two, &two, &two, &lses, &mut [&mut a[..], &mut b[..]],
                               &mut [&mut c[..], &mut d2[..]], &mut [&mut e2[..], &mut f[..]])
        .unwrap_err();
    assert!(err.message.contains("dtype"), "{}", err.message);
    assert_eq!(shard_rows(2, 0, 4, true), vec![0, 1, 6, 7]);
    assert_eq!(shard_rows(2, 1, 4, false), vec![4, 5, 6, 7]);
}
