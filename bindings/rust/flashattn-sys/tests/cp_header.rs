//! Keeps src/cp.rs in line with include/flashattn/flashattn_cp.h, as tests/header.rs does for the
//! core: every function the header declares is declared in src/cp.rs with the same argument
//! count and types, and every enum value matches. Text only (src/cp.rs is compiled with the
//! feature "cp"; its linking is what the flashattn crate's cp tests exercise).
mod common;

use common::*;
use std::path::PathBuf;

const CP_RS: &str = include_str!("../src/cp.rs");

fn header_text() -> String {
    let path = match std::env::var_os("FLASHATTN_CP_HEADER") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../include/flashattn/flashattn_cp.h"),
    };
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

#[test]
fn every_cp_function_is_declared_with_the_same_signature() {
    assert_functions_match(&header_text(), CP_RS, "src/cp.rs", 10);
}

#[test]
fn every_cp_enum_value_matches() {
    assert_enums_match(&header_text(), CP_RS, "src/cp.rs");
}
