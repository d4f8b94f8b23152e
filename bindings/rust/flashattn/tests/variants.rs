//! The 0.3 attention variants on the CPU backend through the safe API: sink logits and ALiBi
//! against a float64 loop reference written here, and the merge of two partial states (a
//! top-left causal prefix and a bottom-right causal suffix) against one causal call.
use flashattn::*;

struct Case {
    b: usize,
    sq: usize,
    sk: usize,
    h: usize,
    d: usize,
}

fn rand(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((*seed >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0) as f32
        })
        .collect()
}

/// O and LSE ([b][h][sq]) of causal attention with the given diagonal offset (sk - sq: bottom-right,
/// 0: top-left), optional sinks and slopes.
fn reference(c: &Case, q: &[f32], k: &[f32], v: &[f32], off: i64, sinks: Option<&[f32]>, slopes: Option<&[f32]>)
             -> (Vec<f64>, Vec<f64>) {
    let (mut o, mut lse) = (vec![0f64; c.b * c.sq * c.h * c.d], vec![0f64; c.b * c.h * c.sq]);
    for b in 0..c.b {
        for h in 0..c.h {
            for i in 0..c.sq {
                let diag = i as i64 + off;
                let mut s: Vec<(usize, f64)> = Vec::new();
                for j in 0..c.sk {
                    if j as i64 > diag {
                        continue;
                    }
                    let dot: f64 = (0..c.d)
                        .map(|x| q[((b * c.sq + i) * c.h + h) * c.d + x] as f64 * k[((b * c.sk + j) * c.h + h) * c.d + x] as f64)
                        .sum();
                    let bias = slopes.map_or(0.0, |sl| -(sl[h] as f64) * (diag - j as i64).abs() as f64);
                    s.push((j, dot / (c.d as f64).sqrt() + bias));
                }
                let sink = sinks.map(|sv| sv[h] as f64);
                let m = s.iter().map(|x| x.1).chain(sink).fold(f64::NEG_INFINITY, f64::max);
                let li = (b * c.h + h) * c.sq + i;
                if m == f64::NEG_INFINITY {
                    lse[li] = f64::NEG_INFINITY;
                    continue;
                }
                let l: f64 = s.iter().map(|x| (x.1 - m).exp()).sum::<f64>() + sink.map_or(0.0, |x| (x - m).exp());
                for &(j, sj) in &s {
                    let p = (sj - m).exp() / l;
                    for x in 0..c.d {
                        o[((b * c.sq + i) * c.h + h) * c.d + x] += p * v[((b * c.sk + j) * c.h + h) * c.d + x] as f64;
                    }
                }
                lse[li] = m + l.ln();
            }
        }
    }
    (o, lse)
}

fn plan(c: &Case, align: MaskAlign, sinks: bool, alibi: bool) -> Plan {
    let mut p = Plan::with(&[
        (I64Param::Batch, c.b as i64), (I64Param::SeqlenQ, c.sq as i64), (I64Param::SeqlenK, c.sk as i64),
        (I64Param::HeadsQ, c.h as i64), (I64Param::HeadDim, c.d as i64), (I64Param::Dtype, 3),
        (I64Param::Backend, 1), (I64Param::Causal, 1), (I64Param::MaskAlign, align as i64),
        (I64Param::SinkLogits, sinks as i64), (I64Param::Alibi, alibi as i64),
    ])
    .unwrap();
    p.finalize().unwrap();
    p
}

fn close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if w.is_infinite() {
            assert!(*g as f64 == *w, "{what}[{i}]: {g}, want {w}");
        } else {
            assert!((*g as f64 - w).abs() <= tol * (1.0 + w.abs()), "{what}[{i}]: {g}, want {w}");
        }
    }
}

#[test]
fn sinks_and_alibi_match_the_reference() {
    let c = Case { b: 2, sq: 9, sk: 13, h: 3, d: 16 };
    let mut seed = 7;
    let (q, k, v) = (rand(c.b * c.sq * c.h * c.d, &mut seed), rand(c.b * c.sk * c.h * c.d, &mut seed),
                     rand(c.b * c.sk * c.h * c.d, &mut seed));
    let sinks = vec![0.5f32, -1.0, 2.0];
    let slopes = vec![0.5f32, 0.25, 0.125];
    let p = plan(&c, MaskAlign::TopLeft, true, true);
    let (mut o, mut lse) = (vec![f32::NAN; q.len()], vec![f32::NAN; c.b * c.h * c.sq]);
    p.execute_variants(&q, &k, &v, &mut o, Some(&mut lse), None, Some(&sinks), Some(&slopes), None).unwrap();
    let (ro, rl) = reference(&c, &q, &k, &v, 0, Some(&sinks), Some(&slopes));
    close(&o, &ro, 2e-5, "O");
    close(&lse, &rl, 1e-5, "LSE");
    // The plan needs its arrays: the 0.2 entry point refuses it.
    let err = p.execute(&q, &k, &v, &mut o, None, None).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    // An argument set refuses values outside flashattn_arg_t's ranges and reads back what was set.
    let mut args = Args::new().unwrap();
    args.set(Arg::SinkLogits, sinks.as_ptr() as *const std::ffi::c_void).unwrap();
    assert_eq!(args.get(Arg::SinkLogits).unwrap(), sinks.as_ptr() as *const std::ffi::c_void);
    // dsink through the backward, against central differences of sum(O * g) through the reference.
    let g = rand(q.len(), &mut seed);
    let (mut dq, mut dk, mut dv, mut dsink) = (vec![0f32; q.len()], vec![0f32; k.len()], vec![0f32; v.len()], vec![f32::NAN; 3]);
    p.backward_variants(&q, &k, &v, &o, &g, &lse, &mut dq, &mut dk, &mut dv, None, Some(&sinks), Some(&slopes),
                        Some(&mut dsink), None).unwrap();
    for h in 0..3 {
        let loss = |delta: f32| -> f64 {
            let mut s = sinks.clone();
            s[h] += delta;
            let (ro, _) = reference(&c, &q, &k, &v, 0, Some(&s), Some(&slopes));
            ro.iter().zip(&g).map(|(a, b)| a * *b as f64).sum()
        };
        let eps = 1.0 / 64.0;  // exact in f32, so the perturbed sinks are what the reference sees
        let fd = (loss(eps) - loss(-eps)) / (2.0 * eps as f64);
        assert!((dsink[h] as f64 - fd).abs() <= 2e-3 * (1.0 + fd.abs()), "dsink[{h}] = {}, fd {fd}", dsink[h]);
    }
}

#[test]
fn merge_reproduces_one_causal_call() {
    let (b, s, h, d, cut) = (2usize, 12usize, 2usize, 8usize, 5usize);
    let mut seed = 11;
    let (q, k, v) = (rand(b * s * h * d, &mut seed), rand(b * s * h * d, &mut seed), rand(b * s * h * d, &mut seed));
    let slice = |x: &[f32], from: usize, to: usize| -> Vec<f32> {
        (0..b).flat_map(|bi| x[(bi * s + from) * h * d..(bi * s + to) * h * d].to_vec()).collect()
    };
    let run = |sk: usize, from: usize, align: MaskAlign| {
        let c = Case { b, sq: s, sk, h, d };
        let p = plan(&c, align, false, false);
        let (mut o, mut lse) = (vec![f32::NAN; b * s * h * d], vec![f32::NAN; b * h * s]);
        p.execute(&q, &slice(&k, from, from + sk), &slice(&v, from, from + sk), &mut o, Some(&mut lse), None).unwrap();
        (p, o, lse)
    };
    let (p1, o1, l1) = run(cut, 0, MaskAlign::TopLeft);
    let (_p2, o2, l2) = run(s - cut, cut, MaskAlign::BottomRight);
    assert!(l2[..cut].iter().all(|x| *x == f32::NEG_INFINITY));
    let (mut o, mut lse) = (vec![f32::NAN; o1.len()], vec![f32::NAN; l1.len()]);
    p1.merge_states::<f32, f32>(&[&o1, &o2], &[&l1, &l2], &mut o, Some(&mut lse)).unwrap();
    let (ro, rl) = reference(&Case { b, sq: s, sk: s, h, d }, &q, &k, &v, 0, None, None);
    close(&o, &ro, 2e-5, "O");
    close(&lse, &rl, 1e-5, "LSE");
}
