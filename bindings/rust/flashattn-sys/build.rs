//! Finds libflashattn for linking:
//! 1. FLASHATTN_LIB_DIR: the directory holding libflashattn.so;
//! 2. `pkg-config --variable=libdir flashattn` (the tool named by $PKG_CONFIG, default
//!    `pkg-config`: it knows PKG_CONFIG_PATH, PKG_CONFIG_LIBDIR, the system's search path and the
//!    built-in variables such as `${pcfiledir}` of a relocatable flashattn.pc);
//! 3. without a working tool, a flashattn.pc on PKG_CONFIG_PATH, parsed here (no pkg-config crate:
//!    no dependencies), with pkg-config's built-ins `${pcfiledir}`, `${pc_sysrootdir}` and
//!    `${pc_top_builddir}` defined as the tool defines them;
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

/// pkg-config's built-in variables for the .pc file at `path`: its directory (the base of a
/// relocatable file), the sysroot and the top build directory.
fn builtin_vars(path: &Path) -> HashMap<String, String> {
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let dir = fs::canonicalize(&dir).unwrap_or(dir);
    let mut vars = HashMap::new();
    vars.insert("pcfiledir".to_string(), dir.display().to_string());
    vars.insert("pc_sysrootdir".to_string(), env::var("PKG_CONFIG_SYSROOT_DIR").unwrap_or_else(|_| "/".to_string()));
    vars.insert(
        "pc_top_builddir".to_string(),
        env::var("PKG_CONFIG_TOP_BUILD_DIR").unwrap_or_else(|_| "$(top_builddir)".to_string()),
    );
    vars
}

/// The variables of a .pc file, `${var}` references expanded (built-ins included).
fn parse_pc(path: &Path) -> Option<HashMap<String, String>> {
    let text = fs::read_to_string(path).ok()?;
    let mut vars = builtin_vars(path);
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
            return vars.get("libdir").map(|l| (normalize(Path::new(l)), pc));
        }
    }
    None
}

/// `dir` with `..` and `.` resolved (canonical when it exists), so the search path printed to
/// cargo is the plain directory.
fn normalize(dir: &Path) -> PathBuf {
    fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf())
}

fn libdir_from_pkg_config_tool() -> Option<PathBuf> {
    let tool = env::var_os("PKG_CONFIG").filter(|t| !t.is_empty()).unwrap_or_else(|| "pkg-config".into());
    let out = Command::new(tool).args(["--variable=libdir", "flashattn"]).output().ok()?;
    let dir = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !dir.is_empty()).then(|| normalize(Path::new(&dir)))
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=FLASHATTN_LIB_DIR");
    for var in ["PKG_CONFIG_PATH", "PKG_CONFIG_LIBDIR", "PKG_CONFIG_SYSROOT_DIR", "PKG_CONFIG"] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    let libdir = if let Some(dir) = env::var_os("FLASHATTN_LIB_DIR").filter(|d| !d.is_empty()) {
        Some(PathBuf::from(dir))
    } else if let Some(dir) = libdir_from_pkg_config_tool() {
        Some(dir)
    } else if let Some((dir, pc)) = libdir_from_pkg_config_path() {
        println!("cargo:rerun-if-changed={}", pc.display());
        Some(dir)
    } else {
        None
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

    // Feature "cp": libflashattn_cp (context parallelism), from FLASHATTN_CP_LIB_DIR or beside the
    // core library (installed together; the search path above).
    if env::var_os("CARGO_FEATURE_CP").is_some() {
        println!("cargo:rerun-if-env-changed=FLASHATTN_CP_LIB_DIR");
        if let Some(dir) = env::var_os("FLASHATTN_CP_LIB_DIR").filter(|d| !d.is_empty()) {
            println!("cargo:rustc-link-search=native={}", PathBuf::from(dir).display());
        }
        println!("cargo:rustc-link-lib=dylib=flashattn_cp");
    }
}
