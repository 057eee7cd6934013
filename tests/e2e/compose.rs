//! `docker-compose.yml` cannot be run here (no Docker engine), so this
//! checks that it parses and that everything it names exists.

use std::path::Path;

use yaml_serde::Value;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

fn text(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_compose_file_parses_and_names_what_exists() {
    let compose: Value = yaml_serde::from_str(&text("docker-compose.yml")).expect("valid YAML");
    let services = compose["services"].as_mapping().expect("a services map");
    let names: Vec<&str> = services.keys().filter_map(Value::as_str).collect();
    for expected in ["postgres", "redis", "migrate", "service", "payments"] {
        assert!(names.contains(&expected), "service {expected}");
    }
    for (name, service) in services {
        let name = name.as_str().unwrap();
        // Images are pinned to a version, never `latest`.
        if let Some(image) = service["image"].as_str() {
            let tag = image.split_once(':').map(|(_, tag)| tag).unwrap_or("");
            assert!(
                tag.chars().next().is_some_and(|c| c.is_ascii_digit()),
                "{name}: image {image} is not pinned"
            );
        }
        // Builds use the Dockerfile at the root.
        if service["build"].as_str() == Some(".") {
            assert!(root().join("Dockerfile").is_file(), "{name}: no Dockerfile");
        }
        // Every dependency exists; health conditions have a healthcheck.
        if let Some(depends) = service["depends_on"].as_mapping() {
            for (dependency, condition) in depends {
                let dependency = dependency.as_str().unwrap();
                assert!(
                    names.contains(&dependency),
                    "{name} depends on unknown {dependency}"
                );
                if condition["condition"].as_str() == Some("service_healthy") {
                    assert!(
                        services[dependency]["healthcheck"].is_mapping(),
                        "{dependency} has no healthcheck"
                    );
                }
            }
        }
        // Commands name binaries the Dockerfile builds.
        if let Some(command) = service["command"].as_sequence() {
            let program = command[0].as_str().unwrap();
            if service["build"].is_string() {
                assert!(
                    ["idempotency-service", "payments"].contains(&program),
                    "{name}: unknown program {program}"
                );
            }
            if program == "idempotency-service" {
                let subcommand = command[1].as_str().unwrap();
                assert!(
                    ["serve", "migrate"].contains(&subcommand),
                    "{name}: unknown subcommand {subcommand}"
                );
            }
        }
    }
    assert_eq!(services["migrate"]["command"][1].as_str(), Some("migrate"));
    assert!(root().join("guard/examples/payments.rs").is_file());
    assert!(text("service/Cargo.toml").contains("name = \"idempotency-service\""));
}

#[test]
fn the_dockerfile_builds_with_a_toolchain_the_workspace_accepts() {
    let workspace = text("Cargo.toml");
    let rust_version = workspace
        .lines()
        .find_map(|line| line.strip_prefix("rust-version = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("rust-version in the workspace");
    let dockerfile = text("Dockerfile");
    let image = dockerfile
        .lines()
        .find_map(|line| line.strip_prefix("FROM rust:"))
        .expect("a rust build image");
    assert!(
        image.starts_with(rust_version),
        "the build image {image} is not rust {rust_version}"
    );
    for binary in ["idempotency-service", "--example payments"] {
        assert!(
            dockerfile.contains(binary),
            "the Dockerfile builds {binary}"
        );
    }
}
