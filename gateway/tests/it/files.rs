//! The files users start from: the example configuration, the compose
//! service and the Dockerfile target.

use std::path::Path;

use idempotency_gateway::Config;
use yaml_serde::Value;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
}

fn text(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_example_configuration_and_the_readme_one_are_valid() {
    let example = Config::from_toml(&text("gateway/gateway.example.toml")).expect("it parses");
    example.validate().expect("it validates");
    assert_eq!(example.routes.len(), 3);
    assert_eq!(
        example.routes[2].kind,
        idempotency_gateway::config::RouteKind::Jsonrpc,
        "the MCP route"
    );
    let page = text("docs/guide/gateway.md");
    let section = page
        .split("# Any language: run the gateway")
        .nth(1)
        .expect("the guide's gateway page");
    let toml = section
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a TOML block in it");
    assert_eq!(toml.lines().count(), 5, "the five-line configuration");
    Config::from_toml(toml)
        .expect("the guide's configuration parses")
        .validate()
        .expect("and validates");
}

#[test]
fn compose_runs_the_gateway_target_in_front_of_the_sample_backend() {
    let compose: Value = yaml_serde::from_str(&text("docker-compose.yml")).expect("valid YAML");
    let services = &compose["services"];
    let gateway = &services["gateway"];
    assert_eq!(gateway["build"]["target"].as_str(), Some("gateway"));
    assert_eq!(
        gateway["environment"]["UPSTREAM_URL"].as_str(),
        Some("http://backend:8000")
    );
    assert!(services["backend"]["healthcheck"].is_mapping());
    for service in ["gateway", "backend"] {
        for volume in services[service]["volumes"].as_sequence().expect("volumes") {
            let source = volume
                .as_str()
                .and_then(|v| v.split(':').next())
                .expect("a bind");
            assert!(root().join(source).is_file(), "{service}: {source} exists");
        }
    }
    let dockerfile = text("Dockerfile");
    assert!(dockerfile.contains("FROM debian:bookworm-slim AS gateway"));
    assert!(dockerfile.contains("-p idempotency-gateway --bin idempotency-gateway"));
    let last_stage = dockerfile.rsplit("\nFROM ").next().expect("stages");
    assert!(
        !last_stage.contains("AS gateway") && last_stage.contains("AS service"),
        "the default target stays the service image, named `service` (docs/guide/deploy.md)"
    );
}
