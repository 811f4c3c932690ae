//! Windows path forms (`C:\…`, `C:/…`, `\\server\share\…`) used to be created as literal names
//! inside the workspace on POSIX. They are refused with `permission_denied` by every file tool,
//! nothing is created, and the engine goes on serving the rest of the turn.

use crate::common;

use serde_json::json;

use common::answers::dispatch;

#[test]
fn windows_path_forms_are_refused_and_create_nothing() {
    let ws = tempfile::tempdir().unwrap();
    let forms = [
        "C:\\Users\\me\\notes.txt",
        "C:/Users/me/notes.txt",
        "c:notes.txt",
        "\\\\server\\share\\notes.txt",
        "\\\\?\\C:\\notes.txt",
    ];
    for path in forms {
        let answers = dispatch(
            ws.path(),
            &[
                ("write_file", json!({"path": path, "content": "x"})),
                (
                    "edit_file",
                    json!({"path": path, "old_text": "x", "new_text": "y"}),
                ),
                ("read_file", json!({"path": path})),
                ("write_file", json!({"path": "ok.txt", "content": "fine"})),
            ],
        );
        for a in &answers[..3] {
            assert_eq!(a.outcome(), "permission_denied", "{path}: {a:?}");
            assert!(a.content.contains("Windows path"), "{a:?}");
        }
        assert_eq!(answers[3].content, "Wrote 4 bytes to ok.txt");
    }
    let mut names: Vec<String> = std::fs::read_dir(ws.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["ok.txt"], "no literal Windows names were created");
}
