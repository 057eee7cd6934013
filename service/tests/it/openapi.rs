//! The OpenAPI document: valid OpenAPI 3.1, and complete.

use serde_json::Value;

use crate::support::document;

#[test]
fn the_document_is_valid_openapi_3_1() {
    let meta: Value = serde_json::from_str(include_str!("schemas/openapi-3.1.json")).unwrap();
    let validator = jsonschema::validator_for(&meta).expect("the OpenAPI 3.1 schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(document())
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "not valid OpenAPI 3.1: {errors:#?}");
    assert_eq!(document()["openapi"], "3.1.0");
    // The check has teeth: a document without `info` is refused.
    let mut broken = document().clone();
    broken.as_object_mut().unwrap().remove("info");
    assert!(!validator.is_valid(&broken));
}

#[test]
fn every_endpoint_schema_and_problem_answer_is_documented() {
    let paths = document()["paths"].as_object().unwrap();
    let mut documented: Vec<&str> = paths.keys().map(String::as_str).collect();
    documented.sort_unstable();
    assert_eq!(
        documented,
        [
            "/healthz",
            "/metrics",
            "/openapi.json",
            "/readyz",
            "/v1/admin/keys",
            "/v1/admin/keys.csv",
            "/v1/admin/keys/{scope}/{key}",
            "/v1/admin/keys/{scope}/{key}/decisions",
            "/v1/admin/keys/{scope}/{key}/give-up",
            "/v1/admin/keys/{scope}/{key}/reconcile",
            "/v1/admin/keys/{scope}/{key}/release",
            "/v1/admin/session",
            "/v1/admin/whoami",
            "/v1/keys/lookup",
            "/v1/keys/{key}"
        ]
    );
    let statuses = |path: &str, method: &str| -> Vec<String> {
        let mut codes: Vec<String> = document()["paths"][path][method]["responses"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        codes.sort();
        codes
    };
    assert_eq!(
        statuses("/v1/keys/{key}", "get"),
        ["200", "400", "401", "404", "503"]
    );
    assert_eq!(
        statuses("/v1/keys/lookup", "post"),
        ["200", "400", "401", "413", "503"]
    );
    assert_eq!(statuses("/readyz", "get"), ["200", "503"]);
    assert_eq!(
        statuses("/v1/admin/keys", "get"),
        ["200", "400", "401", "403", "503"]
    );
    assert_eq!(
        statuses("/v1/admin/keys/{scope}/{key}", "delete"),
        ["200", "400", "401", "403", "404", "409", "422", "503"]
    );
    assert_eq!(
        statuses("/v1/admin/keys/{scope}/{key}/release", "post"),
        ["200", "400", "401", "403", "404", "409", "422", "503"]
    );
    assert_eq!(
        statuses("/v1/admin/keys/{scope}/{key}/give-up", "post"),
        ["200", "400", "401", "403", "404", "409", "422", "503"]
    );
    assert_eq!(
        statuses("/v1/admin/keys/{scope}/{key}", "get"),
        ["200", "400", "401", "403", "404", "503"]
    );
    assert_eq!(
        statuses("/v1/admin/keys/{scope}/{key}/reconcile", "post"),
        ["200", "400", "401", "403", "404", "409", "422", "503"]
    );
    assert_eq!(
        statuses("/v1/admin/keys/{scope}/{key}/decisions", "get"),
        ["200", "400", "401", "403", "503"]
    );
    assert_eq!(
        statuses("/v1/admin/keys.csv", "get"),
        ["200", "400", "401", "403", "503"]
    );
    assert!(
        document()["paths"]["/v1/admin/keys.csv"]["get"]["responses"]["200"]["content"]
            .get("text/csv")
            .is_some(),
        "the export is text/csv"
    );
    assert_eq!(statuses("/v1/admin/whoami", "get"), ["200", "401"]);
    assert_eq!(statuses("/v1/admin/session", "post"), ["200", "401"]);
    assert_eq!(
        statuses("/v1/admin/session", "delete"),
        ["204", "401", "403"]
    );
    // The console's session cookie is the other way in, but not into
    // the sign-in (which takes the token).
    for (path, method) in [
        ("/v1/admin/keys", "get"),
        ("/v1/admin/keys/{scope}/{key}/release", "post"),
        ("/v1/admin/session", "delete"),
    ] {
        assert_eq!(
            document()["paths"][path][method]["security"][1]["console_session"],
            serde_json::json!([]),
            "{method} {path}"
        );
    }
    assert_eq!(
        document()["paths"]["/v1/admin/session"]["post"]["security"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    for (path, method) in [
        ("/v1/keys/{key}", "get"),
        ("/v1/keys/lookup", "post"),
        ("/v1/admin/keys", "get"),
        ("/v1/admin/keys.csv", "get"),
        ("/v1/admin/whoami", "get"),
        ("/v1/admin/keys/{scope}/{key}", "get"),
        ("/v1/admin/keys/{scope}/{key}", "delete"),
        ("/v1/admin/keys/{scope}/{key}/release", "post"),
        ("/v1/admin/keys/{scope}/{key}/reconcile", "post"),
        ("/v1/admin/keys/{scope}/{key}/decisions", "get"),
        ("/v1/admin/session", "post"),
        ("/v1/admin/session", "delete"),
    ] {
        let operation = &document()["paths"][path][method];
        assert_eq!(
            operation["security"][0]["bearer"],
            serde_json::json!([]),
            "{path} needs the bearer token"
        );
        // Every decision takes a reason (signing in and out is none).
        if path.starts_with("/v1/admin") && method != "get" && path != "/v1/admin/session" {
            let reason = operation["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == "reason")
                .unwrap_or_else(|| panic!("{method} {path} takes a reason"));
            assert_eq!(
                reason["required"], true,
                "{method} {path}: the reason is required"
            );
        }
        let problem =
            &operation["responses"]["401"]["content"]["application/problem+json"]["schema"]["$ref"];
        assert_eq!(problem, "#/components/schemas/Problem");
    }
    let schemas = document()["components"]["schemas"].as_object().unwrap();
    for name in [
        "KeyStatus",
        "KeyState",
        "Advice",
        "LookupRequest",
        "LookupResponse",
        "LookupResult",
        "MissingKey",
        "Problem",
        "Health",
        "AdminRecord",
        "AdminPage",
        "AdminAction",
        "AdminRecordDetail",
        "AdminResponse",
        "AdminHeader",
        "AdminBody",
        "AdminEvent",
        "AdminIdentity",
        "Reconciliation",
        "AdminDecision",
        "AdminTrail",
    ] {
        assert!(schemas.contains_key(name), "schema {name}");
    }
    assert_eq!(
        document()["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
}
