//! Workspaces on disk for the tool tests: a fresh temporary one, and the confinement layout —
//! `<tmp>/ws` (the workspace) beside `<tmp>/outside` and `<tmp>/ws-evil` (a sibling whose name
//! starts with the workspace's), whose files must stay unread and unchanged. Both are removed
//! when dropped.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use switchboard::Workspace;
use tempfile::TempDir;

/// A workspace in a fresh temporary directory; keep the `TempDir` alive as long as it is used.
pub fn temp_workspace() -> (TempDir, Workspace) {
    let tmp = tempfile::tempdir().unwrap();
    let ws = Workspace::open(tmp.path()).unwrap();
    (tmp, ws)
}

/// The confinement layout: `base` holds `ws` (the workspace), `outside` and `ws-evil`.
pub struct Confined {
    _tmp: TempDir,
    /// The canonical temporary directory holding the three.
    pub base: PathBuf,
    /// The workspace at `base/ws`.
    pub ws: Workspace,
}

impl Confined {
    /// Creates `ws`, `outside` and `ws-evil`, then `dirs` and `files` (`(path, content)`, both
    /// relative to `base`), then opens the workspace.
    pub fn new(dirs: &[&str], files: &[(&str, &str)]) -> Confined {
        let tmp = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(tmp.path()).unwrap();
        for dir in ["ws", "outside", "ws-evil"].iter().chain(dirs) {
            std::fs::create_dir(base.join(dir)).unwrap();
        }
        for (path, content) in files {
            std::fs::write(base.join(path), content).unwrap();
        }
        let ws = Workspace::open(base.join("ws")).unwrap();
        Confined {
            _tmp: tmp,
            base,
            ws,
        }
    }

    /// `rel` inside the workspace, as a host path.
    pub fn ws_path(&self, rel: &str) -> PathBuf {
        self.base.join("ws").join(rel)
    }

    /// Plants a symlink `name` inside the workspace pointing at `target`.
    pub fn link(&self, target: impl AsRef<Path>, name: &str) {
        symlink(target, self.ws_path(name)).unwrap();
    }
}
