//! The house rules, checked on the source itself: no file over 1,000 lines, no function over
//! 120, a `//!` header on every module of the library and the binary, and data flowing one
//! way through the library: the order of `pub mod` lines in `src/lib.rs` is the layering, top
//! to bottom, and a module may name (`crate::x`) only modules listed after it. `docs/layout.md`
//! lists the library's modules in the same order.
//!
//! A test binary of its own: it reads files, never the library.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use syn::visit::Visit;

const MAX_FILE_LINES: usize = 1_000;
const MAX_FUNCTION_LINES: usize = 120;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn source_files() -> Vec<PathBuf> {
    ["src", "tests", "benches"]
        .iter()
        .flat_map(|dir| rust_files(&root().join(dir)))
        .collect()
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

fn parse(path: &Path) -> syn::File {
    let text = fs::read_to_string(path).unwrap();
    syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", relative(path)))
}

#[test]
fn no_source_file_is_over_a_thousand_lines() {
    let long: Vec<String> = source_files()
        .iter()
        .filter_map(|path| {
            let lines = fs::read_to_string(path).unwrap().lines().count();
            (lines > MAX_FILE_LINES).then(|| format!("{} ({lines} lines)", relative(path)))
        })
        .collect();
    assert!(
        long.is_empty(),
        "files over {MAX_FILE_LINES} lines: {long:#?}"
    );
}

/// Collects the functions and methods (trait methods with a body included) over the limit.
struct FunctionLengths {
    file: String,
    long: Vec<String>,
}

impl FunctionLengths {
    fn check(&mut self, name: &syn::Ident, span: proc_macro2::Span) {
        let lines = span.end().line - span.start().line + 1;
        if lines > MAX_FUNCTION_LINES {
            self.long.push(format!(
                "{}:{} {name} ({lines} lines)",
                self.file,
                span.start().line
            ));
        }
    }
}

impl<'ast> Visit<'ast> for FunctionLengths {
    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        let span = syn::spanned::Spanned::span(item);
        self.check(&item.sig.ident, span);
        syn::visit::visit_item_fn(self, item);
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        let span = syn::spanned::Spanned::span(item);
        self.check(&item.sig.ident, span);
        syn::visit::visit_impl_item_fn(self, item);
    }

    fn visit_trait_item_fn(&mut self, item: &'ast syn::TraitItemFn) {
        if item.default.is_some() {
            let span = syn::spanned::Spanned::span(item);
            self.check(&item.sig.ident, span);
        }
        syn::visit::visit_trait_item_fn(self, item);
    }
}

#[test]
fn no_function_is_over_a_hundred_and_twenty_lines() {
    let mut long = Vec::new();
    for path in source_files() {
        let mut visitor = FunctionLengths {
            file: relative(&path),
            long: Vec::new(),
        };
        visitor.visit_file(&parse(&path));
        long.extend(visitor.long);
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FUNCTION_LINES} lines: {long:#?}"
    );
}

#[test]
fn every_module_of_the_library_and_the_binary_says_what_it_is_for() {
    let missing: Vec<String> = rust_files(&root().join("src"))
        .iter()
        .filter(|path| {
            let text = fs::read_to_string(path).unwrap();
            let first = text.lines().find(|line| !line.trim().is_empty());
            !first.is_some_and(|line| line.starts_with("//!"))
        })
        .map(|path| relative(path))
        .collect();
    assert!(
        missing.is_empty(),
        "modules without a //! header: {missing:#?}"
    );
}

/// The library's top-level modules in the order `src/lib.rs` declares them.
fn library_layers() -> Vec<String> {
    let lib = parse(&root().join("src/lib.rs"));
    lib.items
        .iter()
        .filter_map(|item| match item {
            syn::Item::Mod(module) => Some(module.ident.to_string()),
            _ => None,
        })
        .collect()
}

/// The files of one top-level module of the library: `src/NAME.rs` and `src/NAME/**`.
fn module_files(name: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let file = root().join(format!("src/{name}.rs"));
    if file.exists() {
        files.push(file);
    }
    let dir = root().join(format!("src/{name}"));
    if dir.is_dir() {
        files.extend(rust_files(&dir));
    }
    files
}

/// Collects the first segment after `crate::` of every path and `use` tree.
struct CrateReferences {
    modules: BTreeMap<String, usize>,
}

impl CrateReferences {
    fn note(&mut self, name: String, line: usize) {
        self.modules.entry(name).or_insert(line);
    }

    fn use_tree(&mut self, tree: &syn::UseTree, under_crate: bool) {
        match tree {
            syn::UseTree::Path(path) if path.ident == "crate" => self.use_tree(&path.tree, true),
            syn::UseTree::Path(path) if under_crate => {
                self.note(path.ident.to_string(), path.ident.span().start().line)
            }
            syn::UseTree::Name(name) if under_crate => {
                self.note(name.ident.to_string(), name.ident.span().start().line)
            }
            syn::UseTree::Rename(rename) if under_crate => {
                self.note(rename.ident.to_string(), rename.ident.span().start().line)
            }
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(tree, under_crate);
                }
            }
            _ => {}
        }
    }
}

impl<'ast> Visit<'ast> for CrateReferences {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&item.tree, false);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let mut segments = path.segments.iter();
        if let (Some(first), Some(second)) = (segments.next(), segments.next()) {
            if first.ident == "crate" {
                self.note(second.ident.to_string(), second.ident.span().start().line);
            }
        }
        syn::visit::visit_path(self, path);
    }
}

#[test]
fn library_modules_import_only_the_modules_below_them() {
    let layers = library_layers();
    assert!(layers.len() > 5, "src/lib.rs declares {layers:?}");
    let mut upward = Vec::new();
    for (rank, module) in layers.iter().enumerate() {
        for path in module_files(module) {
            let mut references = CrateReferences {
                modules: BTreeMap::new(),
            };
            references.visit_file(&parse(&path));
            for (name, line) in references.modules {
                let Some(target) = layers.iter().position(|layer| *layer == name) else {
                    continue;
                };
                if target <= rank && name != *module {
                    upward.push(format!(
                        "{}:{line}: `{module}` names `crate::{name}`, listed above it in src/lib.rs",
                        relative(&path)
                    ));
                }
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports against the layering: {upward:#?}"
    );
}

#[test]
fn the_layout_page_lists_the_library_in_the_order_of_src_lib_rs() {
    let page = fs::read_to_string(root().join("docs/layout.md")).expect("docs/layout.md");
    let mut last = 0;
    let mut out_of_order = Vec::new();
    for module in library_layers() {
        let needle_dir = format!("`src/{module}/");
        let needle_file = format!("`src/{module}.rs");
        let found = [page.find(&needle_dir), page.find(&needle_file)]
            .into_iter()
            .flatten()
            .min();
        match found {
            Some(position) if position >= last => last = position,
            Some(_) => out_of_order.push(format!("{module} (out of order)")),
            None => out_of_order.push(format!("{module} (not named as `src/{module}...`)")),
        }
    }
    assert!(
        out_of_order.is_empty(),
        "docs/layout.md against src/lib.rs: {out_of_order:#?}"
    );
}
