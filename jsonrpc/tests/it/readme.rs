//! The crate README's server is the example `readme-server` (built by
//! `cargo test`), shown whole, and names features the crate has.

#[test]
fn the_readme_shows_the_built_example_whole() {
    let readme = include_str!("../../README.md");
    let example = include_str!("../../examples/readme-server.rs");
    assert!(
        readme.contains(&format!("```rust\n{example}```")),
        "jsonrpc/README.md must show examples/readme-server.rs whole, in a rust block"
    );
}

#[test]
fn the_readme_names_store_features_the_crate_forwards() {
    let readme = include_str!("../../README.md");
    let manifest = include_str!("../../Cargo.toml");
    assert!(readme.contains(r#"idempotency-jsonrpc = { path = "../idempotency/jsonrpc", default-features = false, features = ["postgres", "sqlite"] }"#));
    for feature in ["postgres", "sqlite", "redis"] {
        assert!(
            manifest.contains(&format!("{feature} = [\"idempotency-guard/{feature}\"]")),
            "Cargo.toml forwards {feature} to the guard"
        );
    }
}
