use std::io::Read;
use std::os::unix::fs::symlink;

use super::*;

/// A scratch tree: `base/outside.txt`, and the root `base/root` holding `inside.txt`,
/// `sub/deep.txt` and symbolic links that stay in or lead out. Removed on drop.
struct Tree {
    base: PathBuf,
}

impl Tree {
    fn new(name: &str) -> Tree {
        let base =
            std::env::temp_dir().join(format!("nokv-local-root-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let root = base.join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(base.join("outside.txt"), b"outside").unwrap();
        std::fs::write(root.join("inside.txt"), b"inside").unwrap();
        std::fs::write(root.join("sub/deep.txt"), b"deep").unwrap();
        symlink("../outside.txt", root.join("up_link")).unwrap();
        symlink(base.join("outside.txt"), root.join("abs_link")).unwrap();
        symlink("..", root.join("dir_out")).unwrap();
        symlink("sub/deep.txt", root.join("in_link")).unwrap();
        Tree { base }
    }

    fn root(&self) -> PathBuf {
        self.base.join("root")
    }

    fn open(&self) -> LocalRoot {
        LocalRoot::open(&self.root()).unwrap()
    }

    /// The root as a kernel without openat2 would confine it.
    fn open_walking(&self) -> LocalRoot {
        LocalRoot {
            how: Resolution::Walk,
            ..self.open()
        }
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn read(root: &LocalRoot, local_path: &str) -> String {
    let mut s = String::new();
    match root.open_source(local_path) {
        Ok(mut f) => f.read_to_string(&mut s).unwrap(),
        Err(e) => panic!("{local_path}: {e:?}"),
    };
    s
}

/// The message of an escape refusal; panics on success or on another error.
fn escape(r: Result<impl std::fmt::Debug, LocalError>) -> String {
    match r {
        Err(LocalError::Escapes(m)) => m,
        other => panic!("expected an escape refusal, got {other:?}"),
    }
}

#[test]
fn a_relative_or_absolute_path_inside_the_root_opens_that_file() {
    let t = Tree::new("inside");
    for root in [t.open(), t.open_walking()] {
        assert_eq!(read(&root, "inside.txt"), "inside");
        assert_eq!(read(&root, "./sub/deep.txt"), "deep");
        let abs = root.path().join("sub/deep.txt");
        assert_eq!(read(&root, abs.to_str().unwrap()), "deep");
    }
}

#[test]
fn an_absolute_path_outside_the_root_is_refused_naming_the_rule() {
    let t = Tree::new("absolute");
    let outside = t.base.join("outside.txt").canonicalize().unwrap();
    for root in [t.open(), t.open_walking()] {
        let m = escape(root.open_source(outside.to_str().unwrap()));
        assert!(m.contains("escapes --local-root"), "{m}");
        assert!(m.contains("absolute path outside"), "{m}");
        let m = escape(root.target("/etc/nokv-test-never-written"));
        assert!(m.contains("absolute path outside"), "{m}");
    }
}

#[test]
fn dot_dot_above_the_root_is_refused_even_when_the_path_comes_back_inside() {
    let t = Tree::new("dotdot");
    for root in [t.open(), t.open_walking()] {
        for p in [
            "../outside.txt",
            "sub/../../outside.txt",
            "../root/inside.txt",
        ] {
            let m = escape(root.open_source(p));
            assert!(m.contains("through `..`"), "{p}: {m}");
            let m = escape(root.target(p));
            assert!(m.contains("through `..`"), "{p}: {m}");
        }
        let abs = format!("{}/../outside.txt", root.path().display());
        assert!(escape(root.open_source(&abs)).contains("through `..`"));
    }
}

#[test]
fn a_symlink_that_leaves_the_root_is_refused() {
    let t = Tree::new("symlink");
    for root in [t.open(), t.open_walking()] {
        for p in ["up_link", "abs_link", "dir_out/outside.txt"] {
            let m = escape(root.open_source(p));
            assert!(m.contains("symbolic link"), "{p}: {m}");
        }
    }
}

#[test]
fn a_restore_target_behind_or_at_a_symlink_that_leaves_the_root_is_refused() {
    let t = Tree::new("target");
    for root in [t.open(), t.open_walking()] {
        // A directory link leading out, and links at the name itself (to an existing file
        // outside, and dangling to an absolute path outside).
        symlink(t.base.join("nowhere.txt"), t.root().join("dangling_out")).ok();
        for p in ["dir_out/new.bin", "up_link", "abs_link", "dangling_out"] {
            let m = escape(root.target(p));
            assert!(m.contains("symbolic link"), "{p}: {m}");
        }
    }
    assert_eq!(
        std::fs::read(t.base.join("outside.txt")).unwrap(),
        b"outside"
    );
    assert!(!t.base.join("nowhere.txt").exists());
}

#[test]
fn a_symlink_that_stays_inside_the_root_is_followed_with_openat2_and_refused_without() {
    let t = Tree::new("inlink");
    let root = t.open();
    if root.how == Resolution::Openat2 {
        assert_eq!(read(&root, "in_link"), "deep");
        let target = root.target("in_link").unwrap();
        assert_eq!(target.existing, Some(EntryKind::Symlink));
    }
    let walking = t.open_walking();
    let m = escape(walking.open_source("in_link"));
    assert!(m.contains("lacks openat2"), "{m}");
}

#[test]
fn a_restore_target_names_its_directory_and_file_and_says_what_is_there() {
    let t = Tree::new("newfile");
    for root in [t.open(), t.open_walking()] {
        let new = root.target("sub/new.bin").unwrap();
        assert_eq!(new.name, "new.bin");
        assert_eq!(new.existing, None);
        let old = root.target("inside.txt").unwrap();
        assert_eq!(old.existing, Some(EntryKind::Other));
        assert!(matches!(root.target("sub/.."), Err(LocalError::Failed(_))));
        assert!(matches!(
            root.target("missing/x.bin"),
            Err(LocalError::Failed(_))
        ));
    }
}

#[test]
fn a_missing_root_or_a_file_as_root_fails_at_start_up() {
    let t = Tree::new("badroot");
    assert!(LocalRoot::open(&t.base.join("missing")).is_err());
    assert!(LocalRoot::open(&t.root().join("inside.txt")).is_err());
}
