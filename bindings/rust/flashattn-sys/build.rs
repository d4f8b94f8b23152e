//! Finds libflashattn for linking:
//! 1. FLASHATTN_LIB_DIR: the directory holding libflashattn.so;
//! 2. a flashattn.pc on PKG_CONFIG_PATH, parsed here (no pkg-config crate: no dependencies);
//! 3. `pkg-config --variable=libdir flashattn` (the system's default search path);
//! 4. otherwise the linker's default search path.
//!
//! The directory used is exported to dependents as DEP_FLASHATTN_LIBDIR.
use std::collections::HashMap;
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn expand(value: &str, vars: &HashMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        match rest[start..].find('}') {
            Some(end) => {
                let name = &rest[start + 2..start + end];
                out.push_str(vars.get(name).map(String::as_str).unwrap_or(""));
                rest = &rest[start + end + 1..];
            }
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// The variables of a .pc file, `${var}` references expanded.
fn parse_pc(path: &Path) -> Option<HashMap<String, String>> {
    let text = fs::read_to_string(path).ok()?;
    let mut vars = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        if let Some(eq) = line.find('=') {
            let (name, value) = (&line[..eq], &line[eq + 1..]);
            if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !name.contains(':') {
                let expanded = expand(value.trim(), &vars);
                vars.insert(name.to_string(), expanded);
            }
        }
    }
    Some(vars)
}

fn libdir_from_pkg_config_path() -> Option<(PathBuf, PathBuf)> {
    let paths = env::var_os("PKG_CONFIG_PATH")?;
    for dir in env::split_paths(&paths) {
        let pc = dir.join("flashattn.pc");
        if pc.is_file() {
            let vars = parse_pc(&pc)?;
            return vars.get("libdir").map(|l| (PathBuf::from(l), pc));
        }
    }
    None
}

fn libdir_from_pkg_config_tool() -> Option<PathBuf> {
    let out = Command::new("pkg-config").args(["--variable=libdir", "flashattn"]).output().ok()?;
    let dir = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !dir.is_empty()).then(|| PathBuf::from(dir))
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=FLASHATTN_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    let libdir = if let Some(dir) = env::var_os("FLASHATTN_LIB_DIR").filter(|d| !d.is_empty()) {
        Some(PathBuf::from(dir))
    } else if let Some((dir, pc)) = libdir_from_pkg_config_path() {
        println!("cargo:rerun-if-changed={}", pc.display());
        Some(dir)
    } else {
        libdir_from_pkg_config_tool()
    };
    match &libdir {
        Some(dir) => {
            println!("cargo:rustc-link-search=native={}", dir.display());
            println!("cargo:libdir={}", dir.display());
        }
        None => println!(
            "cargo:warning=libflashattn not located (set FLASHATTN_LIB_DIR or PKG_CONFIG_PATH); \
             relying on the linker's default search path"
        ),
    }
    println!("cargo:rustc-link-lib=dylib=flashattn");
}
