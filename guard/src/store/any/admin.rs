//! The operators' operations ([`AdminStore`]) of the store chosen at run
//! time: each delegated to the backend, as every other operation is.

use super::{AnyStore, Backend};
use crate::store::admin::{ForgetRule, Forgotten, Page, PageRequest, StateFilter};
use crate::store::{AdminStore, StoreError};

impl AdminStore for Backend {
    async fn list(
        &self,
        scope: &str,
        filter: StateFilter,
        page: PageRequest<'_>,
    ) -> Result<Page, StoreError> {
        on_backend!(self, store => AdminStore::list(store, scope, filter, page).await)
    }

    async fn forget(
        &self,
        scope: &str,
        key: &str,
        rule: ForgetRule,
    ) -> Result<Forgotten, StoreError> {
        on_backend!(self, store => AdminStore::forget(store, scope, key, rule).await)
    }

    async fn held_without_record(
        &self,
        scope: &str,
        keys: &[&str],
    ) -> Result<Vec<bool>, StoreError> {
        on_backend!(self, store => AdminStore::held_without_record(store, scope, keys).await)
    }
}

impl AdminStore for AnyStore {
    async fn list(
        &self,
        scope: &str,
        filter: StateFilter,
        page: PageRequest<'_>,
    ) -> Result<Page, StoreError> {
        on_store!(self, store => AdminStore::list(store, scope, filter, page).await)
    }

    async fn forget(
        &self,
        scope: &str,
        key: &str,
        rule: ForgetRule,
    ) -> Result<Forgotten, StoreError> {
        on_store!(self, store => AdminStore::forget(store, scope, key, rule).await)
    }

    async fn held_without_record(
        &self,
        scope: &str,
        keys: &[&str],
    ) -> Result<Vec<bool>, StoreError> {
        on_store!(self, store => AdminStore::held_without_record(store, scope, keys).await)
    }
}
