//! Three `coloc serve` processes on one PostgreSQL database (filled in below).
