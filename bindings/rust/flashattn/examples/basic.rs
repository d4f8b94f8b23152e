//! Causal attention with GQA over random fp32 host tensors on the CPU backend.
//!
//!     FLASHATTN_LIB_DIR=build/src LD_LIBRARY_PATH=build/src cargo run --example basic
use flashattn::{attention, I64Param, Options, Plan, Shape};

fn main() -> Result<(), flashattn::Error> {
    let shape = Shape::new(2, 128, 128, 8, 2, 64); // batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim
    let mut seed = 0x2545F4914F6CDD1Du64;
    let mut random = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect()
    };
    let (q, k, v) = (random(shape.q_len()), random(shape.k_len()), random(shape.v_len()));

    // One call.
    let out = attention(&q, &k, &v, &shape, &Options { causal: true, ..Options::default() })?;

    // The same through a plan: create, set, finalize, execute (any number of times), drop.
    let mut plan = Plan::with(&[
        (I64Param::Batch, 2), (I64Param::SeqlenQ, 128), (I64Param::SeqlenK, 128), (I64Param::HeadsQ, 8),
        (I64Param::HeadsKv, 2), (I64Param::HeadDim, 64), (I64Param::Dtype, flashattn::DType::Fp32.raw() as i64),
        (I64Param::Causal, 1), (I64Param::Backend, flashattn::Backend::Cpu.raw() as i64),
    ])?;
    plan.finalize()?;
    let (backend, reason) = plan.backend()?;
    let mut workspace = plan.workspace()?;
    let mut o = vec![0f32; shape.o_len()];
    plan.execute(&q, &k, &v, &mut o, None, Some(&mut workspace))?;

    println!("libflashattn {} ({}), backend {:?}: {}", flashattn::version_string(), flashattn::build_info(), backend, reason);
    println!("o[0..4] = {:?}, lse[0] = {}, plan == attention(): {}", &out.o[..4], out.lse[0], o == out.o);
    assert_eq!(o, out.o);

    // Errors carry the status and the library's message.
    let err = Plan::new()?.set_i64(I64Param::HeadDim, 12).unwrap_err();
    println!("expected error: {err}");
    Ok(())
}
