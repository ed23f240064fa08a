//! Opening a store: check the file's header before SQLite writes anything, connect in WAL mode with a
//! busy timeout and foreign keys, apply the migrations in `migrations/`, and mark dead runs interrupted.
//! Reading commands ([`OpenMode::Read`]) fall back to a read-only connection when the file or its
//! filesystem cannot be written, and then change nothing.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection};

use super::migrations::migrator;
use super::{APPLICATION_ID, Store, StoreError, sql_error};

/// How long a connection waits for another writer before giving up.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Create the file if it does not exist (`roll-tui run`).
    Create,
    /// The file must exist (resume, deleting runs).
    Existing,
    /// The file must exist and is only read (listing, metrics, samples, export, the workbench):
    /// opened for writing when it can be (an older store is upgraded, dead runs are marked
    /// interrupted), else read-only, so a store on a read-only file or filesystem can be read.
    Read,
}

impl Store {
    /// Open (or create) the store at `path`. A file that is not ours is refused before SQLite opens it
    /// for writing, so it is never modified.
    pub async fn open(path: &Path, mode: OpenMode) -> Result<Store, StoreError> {
        match Store::open_writable(path, mode).await {
            // Not writable here (a read-only file, directory or filesystem): read it as it is.
            // Any other failure (a lock held too long, a full disk) is reported as it is.
            Err(
                e
                @ (StoreError::Sql { .. } | StoreError::Busy { .. } | StoreError::ReadOnly { .. }),
            ) if mode == OpenMode::Read => {
                if writable(path) {
                    Err(e)
                } else {
                    Store::open_read_only(path).await
                }
            }
            other => other,
        }
    }

    async fn open_writable(path: &Path, mode: OpenMode) -> Result<Store, StoreError> {
        let exists = path.exists();
        if !exists && mode != OpenMode::Create {
            return Err(StoreError::Missing { path: path.into() });
        }
        if exists {
            check_file(path).await?;
        } else if let Some(dir) = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty() && !d.is_dir())
        {
            return Err(StoreError::Schema {
                path: path.into(),
                detail: format!(
                    "cannot create it: directory '{}' does not exist",
                    dir.display()
                ),
            });
        }
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true)
            // Replay reads megabytes of metric chunks: map the file instead of copying it page by page.
            .pragma("mmap_size", "268435456");
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .map_err(sql_error(path, "opening"))?;
        let store = Store {
            pool,
            path: path.into(),
        };
        store.migrate().await?;
        store.mark_dead_runs_interrupted().await?;
        Ok(store)
    }

    /// A connection that never writes: read-only, or immutable where SQLite cannot even create the
    /// shared-memory file that reading a WAL database needs (a read-only filesystem). The schema must
    /// be this version's, since it cannot be upgraded here.
    async fn open_read_only(path: &Path) -> Result<Store, StoreError> {
        check_file(path).await?;
        let options = SqliteConnectOptions::new()
            .filename(path)
            .read_only(true)
            .busy_timeout(BUSY_TIMEOUT)
            .pragma("mmap_size", "268435456");
        // `immutable` reads the main file only: right when nothing can be waiting in a `-wal`
        // file, wrong (stale) otherwise.
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        let wal_pending = std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0);
        let tries: &[bool] = if wal_pending {
            &[false]
        } else {
            &[false, true]
        };
        let mut last = None;
        for &immutable in tries {
            let opened = async {
                let pool = SqlitePoolOptions::new()
                    .max_connections(4)
                    .connect_with(options.clone().immutable(immutable))
                    .await?;
                let applied: Vec<(i64, Vec<u8>)> =
                    sqlx::query_as("SELECT version, checksum FROM _sqlx_migrations")
                        .fetch_all(&pool)
                        .await?;
                Ok::<_, sqlx::Error>((pool, applied))
            };
            match opened.await {
                Ok((pool, applied)) => {
                    check_read_only_schema(path, &applied)?;
                    return Ok(Store {
                        pool,
                        path: path.into(),
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        if wal_pending {
            return Err(StoreError::Schema {
                path: path.into(),
                detail: format!(
                    "it cannot be written here and changes are still in '{}', which SQLite \
                     cannot read without writing; copy the store and its -wal file somewhere \
                     writable",
                    std::path::Path::new(&wal).display()
                ),
            });
        }
        let source = last.unwrap_or(sqlx::Error::PoolClosed);
        Err(sql_error(path, "opening read-only")(source))
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        migrator().run(&self.pool).await.map_err(|e| match e {
            sqlx::migrate::MigrateError::VersionMissing(v) => StoreError::Schema {
                path: self.path.clone(),
                detail: format!(
                    "written by a newer roll-tui (schema migration {v} is unknown to this version); \
                     upgrade roll-tui"
                ),
            },
            sqlx::migrate::MigrateError::Execute(source) => {
                sql_error(&self.path, "applying migrations")(source)
            }
            other => StoreError::Schema {
                path: self.path.clone(),
                detail: format!("migrations failed: {other}"),
            },
        })?;
        let id: i64 = sqlx::query_scalar("PRAGMA application_id")
            .fetch_one(&self.pool)
            .await
            .map_err(self.err("reading the application id"))?;
        if id as u32 != APPLICATION_ID {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "PRAGMA application_id = {}",
                APPLICATION_ID as i32
            )))
            .execute(&self.pool)
            .await
            .map_err(self.err("writing the application id"))?;
            // Put the header (and its application id) into the main file at once.
            sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                .execute(&self.pool)
                .await
                .map_err(self.err("checkpointing the new store"))?;
        }
        Ok(())
    }
}

/// Refuse files that are not roll-tui stores, reading only (never creating `-wal`/`-shm` files for
/// a file we refuse).
async fn check_file(path: &Path) -> Result<(), StoreError> {
    let mut header = Vec::with_capacity(100);
    let len = std::fs::File::open(path)
        .and_then(|f| {
            let len = f.metadata()?.len();
            f.take(100).read_to_end(&mut header)?;
            Ok(len)
        })
        .map_err(|e| StoreError::NotSqlite {
            path: path.into(),
            reason: format!("cannot read it: {e}"),
        })?;
    if len == 0 {
        // SQLite treats an empty file as an empty database.
        return Ok(());
    }
    let header = parse_header(path, &header, len)?;
    if header.application_id == APPLICATION_ID {
        return Ok(());
    }
    if header.application_id != 0 {
        return Err(StoreError::Foreign {
            path: path.into(),
            reason: format!("application_id {:#010x}", header.application_id),
        });
    }
    // Id 0: a database made elsewhere, or ours before its first checkpoint. Look inside without
    // touching it: `immutable` takes no locks and creates no `-wal`/`-shm` files.
    let url = PathBuf::from(path);
    let mut conn = SqliteConnectOptions::from_str("sqlite://")
        .map_err(sql_error(path, "opening read-only"))?
        .filename(&url)
        .read_only(true)
        .immutable(true)
        .connect()
        .await
        .map_err(sql_error(path, "opening read-only"))?;
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .fetch_all(&mut conn)
            .await
            .map_err(sql_error(path, "reading its schema"))?;
    let id: i64 = sqlx::query_scalar("PRAGMA application_id")
        .fetch_one(&mut conn)
        .await
        .map_err(sql_error(path, "reading its application id"))?;
    let applied: Vec<(i64, Vec<u8>)> = if tables.iter().any(|t| t == "_sqlx_migrations") {
        sqlx::query_as("SELECT version, checksum FROM _sqlx_migrations")
            .fetch_all(&mut conn)
            .await
            .map_err(sql_error(path, "reading its migrations"))?
    } else {
        vec![]
    };
    let _ = conn.close().await;
    if id as u32 == APPLICATION_ID || tables.is_empty() || is_our_schema(&applied) {
        return Ok(());
    }
    let shown: Vec<&str> = tables.iter().take(5).map(String::as_str).collect();
    Err(StoreError::Foreign {
        path: path.into(),
        reason: format!("it holds tables {}", shown.join(", ")),
    })
}

/// Whether this process may write the store and create files beside it (SQLite's `-wal` and
/// `-shm`): the file opens for writing and its directory takes an (unnamed, at once removed)
/// temporary file. Fails on a read-only file, directory or filesystem.
fn writable(path: &Path) -> bool {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::OpenOptions::new().write(true).open(path).is_ok() && tempfile::tempfile_in(dir).is_ok()
}

/// A store opened read-only must have exactly our migrations applied: a newer one cannot be
/// understood, an older one cannot be upgraded without writing.
fn check_read_only_schema(path: &Path, applied: &[(i64, Vec<u8>)]) -> Result<(), StoreError> {
    let ours = migrator();
    if let Some((v, _)) = applied
        .iter()
        .find(|(v, _)| !ours.iter().any(|m| m.version == *v))
    {
        return Err(StoreError::Schema {
            path: path.into(),
            detail: format!(
                "written by a newer roll-tui (schema migration {v} is unknown to this version); \
                 upgrade roll-tui"
            ),
        });
    }
    if !is_our_schema(applied) {
        return Err(StoreError::Foreign {
            path: path.into(),
            reason: "its migrations are not roll-tui's".into(),
        });
    }
    if let Some(m) = ours
        .iter()
        .find(|m| !applied.iter().any(|(v, _)| *v == m.version))
    {
        return Err(StoreError::Schema {
            path: path.into(),
            detail: format!(
                "written by an older roll-tui (without schema migration {}), and it cannot be \
                 upgraded here because it is read-only; open it once where it can be written",
                m.version
            ),
        });
    }
    Ok(())
}

/// Another sqlx application may have a `runs` table too: the schema is ours only if our first
/// migration was applied, with our checksum, and every applied migration with a version we know
/// carries our checksum.
fn is_our_schema(applied: &[(i64, Vec<u8>)]) -> bool {
    let ours = migrator();
    let known = |v: i64| ours.iter().find(|m| m.version == v);
    let first_is_ours = ours.iter().next().is_some_and(|m| {
        applied
            .iter()
            .any(|(v, c)| *v == m.version && *c == *m.checksum)
    });
    first_is_ours
        && applied
            .iter()
            .all(|(v, c)| known(*v).is_none_or(|m| *c == *m.checksum))
}

struct Header {
    application_id: u32,
}

/// The 100-byte SQLite header (https://www.sqlite.org/fileformat.html#the_database_header).
fn parse_header(path: &Path, bytes: &[u8], file_len: u64) -> Result<Header, StoreError> {
    let not_sqlite = |reason: String| StoreError::NotSqlite {
        path: path.into(),
        reason,
    };
    if bytes.len() < 100 || &bytes[..16] != b"SQLite format 3\0" {
        let shown: String = bytes
            .iter()
            .take(16)
            .map(|&b| {
                if b.is_ascii_graphic() || b == b' ' {
                    b as char
                } else {
                    '.'
                }
            })
            .collect();
        return Err(not_sqlite(format!("it starts with '{shown}'")));
    }
    let be32 =
        |at: usize| u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let page_size = match u16::from_be_bytes([bytes[16], bytes[17]]) {
        1 => 65_536u64,
        n if n >= 512 && n.is_power_of_two() => n as u64,
        n => return Err(not_sqlite(format!("invalid page size {n}"))),
    };
    // The in-header page count is trustworthy only when "version-valid-for" matches the change counter.
    let (change_counter, pages, valid_for) = (be32(24), be32(28) as u64, be32(92));
    if valid_for == change_counter && pages * page_size > file_len {
        return Err(StoreError::Corrupt {
            path: path.into(),
            detail: format!(
                "truncated: its header describes {} bytes but the file has {file_len}",
                pages * page_size
            ),
        });
    }
    Ok(Header {
        application_id: be32(68),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_checks_name_the_problem() {
        let p = Path::new("x.db");
        let err = parse_header(p, b"hello world, this is text", 25)
            .err()
            .unwrap();
        assert_eq!(
            err.to_string(),
            "store 'x.db': not an SQLite database (it starts with 'hello world, thi'); refusing to use \
             or change it"
        );
        let mut h = vec![0u8; 100];
        h[..16].copy_from_slice(b"SQLite format 3\0");
        h[16..18].copy_from_slice(&4096u16.to_be_bytes());
        h[24..28].copy_from_slice(&7u32.to_be_bytes());
        h[28..32].copy_from_slice(&3u32.to_be_bytes());
        h[92..96].copy_from_slice(&7u32.to_be_bytes());
        h[68..72].copy_from_slice(&APPLICATION_ID.to_be_bytes());
        assert_eq!(
            parse_header(p, &h, 3 * 4096).unwrap().application_id,
            APPLICATION_ID
        );
        let err = parse_header(p, &h, 4096).err().unwrap();
        assert!(
            err.to_string()
                .contains("truncated: its header describes 12288 bytes but the file has 4096")
        );
        // A stale page count (valid-for differs) is not trusted.
        h[92..96].copy_from_slice(&6u32.to_be_bytes());
        assert!(parse_header(p, &h, 4096).is_ok());
        h[16..18].copy_from_slice(&1000u16.to_be_bytes());
        assert!(
            parse_header(p, &h, 4096)
                .err()
                .unwrap()
                .to_string()
                .contains("invalid page size 1000")
        );
    }
}
