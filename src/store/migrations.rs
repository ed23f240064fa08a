//! The store's schema migrations, the SQL files of `migrations/` compiled into the binary.
//!
//! sqlx's `migrate!` macro would list the directory at compile time, but it needs sqlx's
//! `macros` feature, which builds a second copy of SQLite, sqlx and tokio for the compiler
//! (~200 CPU-seconds of a clean test build, benches/RESULTS.md, thirty-second slice). The list
//! here is what the macro made: each file's version and description from its name
//! (`0002_typed_events.sql`: version 2, "typed events"), its text, and the SHA-384 of that text,
//! which sqlx records for every applied migration and checks again at each open. A store written
//! by an earlier build therefore opens only if these match the macro's byte for byte: the tests
//! pin the digests and check that every file of the directory is listed.

use std::borrow::Cow;

use sqlx::SqlStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};

/// (version, description, SQL) of each migration, oldest first. A new file in `migrations/` must
/// be added here (a test fails until it is).
const MIGRATIONS: [(i64, &str, &str); 3] = [
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
];

/// The migrations this build applies, as sqlx's `migrate!("./migrations")` made them: each in
/// a transaction of its own unless its SQL starts with `-- no-transaction` (sqlx's rule), none
/// reversible.
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
    const DIGESTS: [(i64, &str); 3] = [
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
    ];

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn checksums_are_the_files_sha384() {
        let m = migrator();
        let got: Vec<(i64, String)> = m.iter().map(|m| (m.version, hex(&m.checksum))).collect();
        let want: Vec<(i64, String)> = DIGESTS.iter().map(|&(v, d)| (v, d.into())).collect();
        assert_eq!(got, want);
        assert!(m.iter().all(|m| !m.no_tx));
    }

    /// Every `NNNN_words.sql` of `migrations/` is listed, with the version and description sqlx
    /// derives from its name, and nothing else is.
    #[test]
    fn every_file_of_the_directory_is_listed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut files: Vec<(i64, String)> = std::fs::read_dir(&dir)
            .expect("migrations/")
            .map(|e| e.expect("a directory entry").file_name())
            .filter_map(|name| {
                let name = name.to_string_lossy().into_owned();
                let (version, rest) = name.split_once('_')?;
                let words = rest.strip_suffix(".sql")?;
                Some((version.parse().ok()?, words.replace('_', " ")))
            })
            .collect();
        files.sort();
        let listed: Vec<(i64, String)> = migrator()
            .iter()
            .map(|m| (m.version, m.description.to_string()))
            .collect();
        assert_eq!(listed, files);
    }
}
