//! The incident lab's tests, in one binary: one lab run at CI size, made
//! once and shared by the checks of its figures ([`incident`]) and by the
//! operators' console's browser test on the store it leaves ([`console`]).
//! The programs a run starts are this package's binaries, built with the
//! tests (`lab-payments`, `lab-status-service`).

mod console;
mod incident;
mod lab_run;
