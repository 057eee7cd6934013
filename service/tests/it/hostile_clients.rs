//! Odd requests to the service: bad input is a 400 before the store is
//! asked, and a wrong method is a problem, not an empty body.

use axum::body::Body;
use http::{Method, Request};
use idempotency_guard::store::AnyStore;

use crate::support::{ADMIN_ALL, router};

fn admin(method: Method, path: &str) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {ADMIN_ALL}"))
        .body(Body::empty())
        .expect("a request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_in_an_admin_scope_or_cursor_is_a_bad_request_on_postgres() {
    let db = idempotency_tests::postgres().await;
    let app = router(AnyStore::from(db.store.clone()));
    for path in [
        "/v1/admin/keys?scope=a%00b",
        "/v1/admin/keys?scope=tenant-a&after=k%00",
        "/v1/admin/keys/a%00b/key",
    ] {
        let method = if path.contains('?') {
            Method::GET
        } else {
            Method::DELETE
        };
        let answer = idempotency_tests::call(&app, admin(method, path)).await;
        assert_eq!(answer.status.as_u16(), 400, "{path}: {:?}", answer.json());
        assert_eq!(answer.problem(), "bad-request", "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_method_is_a_405_problem_before_any_token_check() {
    let db = idempotency_tests::sqlite().await;
    let app = router(AnyStore::from(db.store.clone()));
    for (method, path) in [
        (Method::PUT, "/v1/admin/keys/a/b"),
        (Method::DELETE, "/v1/keys/k"),
        (Method::POST, "/healthz"),
    ] {
        let request = Request::builder()
            .method(method.clone())
            .uri(path)
            .body(Body::empty())
            .expect("a request");
        let answer = idempotency_tests::call(&app, request).await;
        assert_eq!(answer.status.as_u16(), 405, "{method} {path}");
        assert_eq!(
            answer.header("content-type"),
            Some("application/problem+json"),
            "{method} {path}"
        );
        assert_eq!(answer.problem(), "method-not-allowed", "{method} {path}");
    }
}
