//! Records the git commit the binary is built from, for `switchboard --version`
//! (`SWITCHBOARD_GIT_COMMIT` in the environment wins: builds from a source tarball set it; without
//! either the commit is `unknown`).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn main() {
    println!("cargo:rerun-if-env-changed=SWITCHBOARD_GIT_COMMIT");
    let commit = std::env::var("SWITCHBOARD_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    // Built again when HEAD moves (a checkout, or a commit on the current branch).
    let refs = git(&["symbolic-ref", "-q", "HEAD"]).into_iter();
    for name in ["HEAD".to_string(), "packed-refs".to_string()]
        .into_iter()
        .chain(refs)
    {
        // Only files that exist: a missing one would make every build run this script again.
        if let Some(path) = git(&["rev-parse", "--git-path", &name])
            && std::path::Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    println!("cargo:rustc-env=SWITCHBOARD_GIT_COMMIT={commit}");
}
