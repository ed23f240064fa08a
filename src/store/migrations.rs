//! The store's schema migrations, the SQL files of `migrations/` compiled into the binary.
//!
//! sqlx's `migrate!` macro would list the directory at compile time, but it needs sqlx's
//! `macros` feature, which builds a second copy of SQLite, sqlx and tokio for the compiler
//! (~200 CPU-seconds of a clean test build, benches/RESULTS.md's git history). The list
//! here is what the macro made: each file's version and description from its name
//! (`0002_typed_events.sql`: version 2, "typed events"), its text, and the SHA-384 of that text.
//! sqlx records the version and checksum of every applied migration and checks them again at
//! each open, so a store written by an earlier build opens only if those match. The tests pin
//! the digests and hold the list to what sqlx itself reads from the directory.

use std::borrow::Cow;

use sqlx::SqlStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};

/// (version, description, SQL) of each migration, oldest first. A new file in `migrations/` must
/// be added here (a test fails until it is).
const MIGRATIONS: [(i64, &str, &str); 5] = [
    (1, "store", include_str!("../../migrations/0001_store.sql")),
    (
        2,
        "typed events",
        include_str!("../../migrations/0002_typed_events.sql"),
    ),
    (
        3,
        "trajectory groups",
        include_str!("../../migrations/0003_trajectory_groups.sql"),
    ),
    (
        4,
        "sample tokens",
        include_str!("../../migrations/0004_sample_tokens.sql"),
    ),
    (
        5,
        "event node",
        include_str!("../../migrations/0005_event_node.sql"),
    ),
];

/// The migrations this build applies, as sqlx's `migrate!("./migrations")` made them: each in
/// a transaction of its own unless its SQL starts with `-- no-transaction` (sqlx's rule), none
/// reversible. Hashes the files at each call (microseconds, a few calls per open).
pub fn migrator() -> Migrator {
    Migrator::with_migrations(
        MIGRATIONS
            .iter()
            .map(|&(version, description, sql)| {
                Migration::new(
                    version,
                    Cow::Borrowed(description),
                    MigrationType::Simple,
                    SqlStr::from_static(sql),
                    sql.starts_with("-- no-transaction"),
                )
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SHA-384 of each file, from coreutils (`sha384sum migrations/*.sql`), not from sqlx:
    /// stores on disk hold these, so they must never change (edit a migration and this fails;
    /// add a new file instead).
    const DIGESTS: [(i64, &str); 5] = [
        (
            1,
            "1b8b7296c5077e9ed533138b3bc2c54a7a88430a477cd52ea534398b6468e6383d54db7218a7e417247a053de8ebb40a",
        ),
        (
            2,
            "733d35b40c527ad7f60d7de5bee52145ff84e8a99fae08d50ba059d3a62304c6ea26b49cae394672a4a6e3a5afa733bf",
        ),
        (
            3,
            "bdc9923545dad14f222652ba6a6ad8f9f5c8086bb4d995aec77019e99bb5caf20484521cb871f472ad83b08024b2d88a",
        ),
        (
            4,
            "12694830cbda60adada2b741b2160bd595b5b9de036cabaceac6d619295105bf21a7d0605185f0712a6714147126c4c4",
        ),
        (
            5,
            "f8f133e2821dcfada0358a97c6d1bdf0c643110eb292ac6c65991dac66e130e3334494580679003ac4eb86ae234db76c",
        ),
    ];

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn checksums_are_the_files_sha384() {
        let ours = migrator();
        let got: Vec<(i64, String)> = ours.iter().map(|m| (m.version, hex(&m.checksum))).collect();
        let want: Vec<(i64, String)> = DIGESTS.iter().map(|&(v, d)| (v, d.into())).collect();
        assert_eq!(got, want);
        // None of ours opts out of its transaction; a later `-- no-transaction` file changes this.
        assert!(ours.iter().all(|m| !m.no_tx));
    }

    /// The list holds what sqlx's own reading of `migrations/` (the code `migrate!` ran at
    /// compile time) finds there, field by field: a file added to the directory and not to the
    /// list, a name sqlx reads differently (`.up.sql`, no number), or another table or option
    /// fails here.
    #[tokio::test]
    async fn the_list_is_what_sqlx_reads_from_the_directory() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let read = Migrator::new(dir).await.expect("sqlx reads migrations/");
        let ours = migrator();
        let fields = |m: &Migrator| {
            m.iter()
                .map(|m| {
                    let sql = m.sql.as_str().to_owned();
                    let description = m.description.to_string();
                    let checksum = m.checksum.to_vec();
                    (
                        m.version,
                        description,
                        m.migration_type,
                        sql,
                        checksum,
                        m.no_tx,
                    )
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(fields(&ours), fields(&read));
        assert_eq!(ours.table_name, read.table_name);
        let options = |m: &Migrator| (m.ignore_missing, m.locking, m.no_tx);
        assert_eq!(options(&ours), options(&read));
        assert_eq!(ours.create_schemas, read.create_schemas);
    }
}
