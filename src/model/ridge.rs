//! Ridge regression on standardised columns, fitted from sums over the rows instead of a
//! matrix of them: the estimator of smartcore's `RidgeRegression` with `normalize` and the
//! Cholesky solver (columns centred and divided by their population deviation, the
//! intercept from the means), so a fit over millions of member rows needs memory for a
//! p x p matrix, not for the rows. The rows are streamed twice (means and deviations, then
//! the centred cross-products); the p x p system is solved by smartcore's Cholesky.
//!
//! Columns that do not vary (within 1e-12 of their first value, relatively) get a zero
//! coefficient instead of a division by a zero deviation.

use smartcore::linalg::{
    basic::{
        arrays::{Array, Array2, MutArray},
        matrix::DenseMatrix,
    },
    traits::cholesky::CholeskyDecomposable,
};

use super::FitError;

/// A fitted ridge: intercept and one coefficient per column (0 for constant columns).
#[derive(Debug, Clone, PartialEq)]
pub struct RidgeFit {
    pub intercept: f64,
    pub coefficients: Vec<f64>,
}

/// Fits ridge regression with penalty `alpha` on the standardised columns of the rows that
/// `rows()` yields (each `(x, y)`; called twice, it must yield the same rows both times).
pub fn fit<const P: usize, I>(alpha: f64, rows: impl Fn() -> I) -> Result<RidgeFit, FitError>
where
    I: Iterator<Item = ([f64; P], f64)>,
{
    // First pass: count, column sums and sums of squares (the deviation as smartcore
    // computes it, E[x^2] - mean^2), the mean label, and which columns vary.
    let mut n = 0usize;
    let mut first = [0.0; P];
    let mut varies = [false; P];
    let mut sum = [0.0; P];
    let mut sum_squares = [0.0; P];
    let mut sum_y = 0.0;
    for (x, y) in rows() {
        if n == 0 {
            first = x;
        }
        for j in 0..P {
            sum[j] += x[j];
            sum_squares[j] += x[j] * x[j];
            varies[j] |= (x[j] - first[j]).abs() > 1e-12 * first[j].abs().max(1.0);
        }
        sum_y += y;
        n += 1;
    }
    let columns: Vec<usize> = (0..P).filter(|&j| varies[j]).collect();
    let p = columns.len();
    if n <= p {
        return Err(FitError::Solver(
            "ridge: Number of rows in X should be >= number of columns in X".into(),
        ));
    }
    let count = n as f64;
    let mean: Vec<f64> = columns.iter().map(|&j| sum[j] / count).collect();
    let deviation: Vec<f64> = columns
        .iter()
        .zip(&mean)
        .map(|(&j, m)| (sum_squares[j] / count - m * m).sqrt())
        .collect();
    if let Some(k) = deviation.iter().position(|s| s.abs() < f64::EPSILON) {
        return Err(FitError::Solver(format!(
            "ridge: Cannot rescale constant column {k}"
        )));
    }

    // Second pass: the Gram matrix of the standardised columns and their products with
    // the label (the label is not centred, as in smartcore; the centred columns make its
    // mean drop out).
    let mut gram = vec![0.0; p * p];
    let mut xty = vec![0.0; p];
    let mut scaled = vec![0.0; p];
    for (x, y) in rows() {
        for (k, &j) in columns.iter().enumerate() {
            scaled[k] = (x[j] - mean[k]) / deviation[k];
        }
        for a in 0..p {
            let sa = scaled[a];
            xty[a] += sa * y;
            let row = &mut gram[a * p..a * p + a + 1];
            for (slot, sb) in row.iter_mut().zip(&scaled[..=a]) {
                *slot += sa * sb;
            }
        }
    }
    let mut system = DenseMatrix::<f64>::zeros(p, p);
    for a in 0..p {
        for b in 0..=a {
            let value = gram[a * p + b] + if a == b { alpha } else { 0.0 };
            system.set((a, b), value);
            system.set((b, a), value);
        }
    }
    let rhs = DenseMatrix::from_2d_vec(&xty.iter().map(|v| vec![*v]).collect::<Vec<_>>())
        .map_err(|e| FitError::Solver(format!("ridge: {e}")))?;
    let solved = system
        .cholesky_solve_mut(rhs)
        .map_err(|e| FitError::Solver(format!("ridge: {e}")))?;

    let mut coefficients = vec![0.0; P];
    let mut intercept = sum_y / count;
    for (k, &j) in columns.iter().enumerate() {
        let w = *solved.get((k, 0)) / deviation[k];
        coefficients[j] = w;
        intercept -= w * mean[k];
    }
    Ok(RidgeFit {
        intercept,
        coefficients,
    })
}

#[cfg(test)]
mod tests {
    use smartcore::linear::ridge_regression::{
        RidgeRegression, RidgeRegressionParameters, RidgeRegressionSolverName,
    };

    use super::*;

    /// smartcore's own ridge on the varying columns: the reference this module must equal.
    fn smartcore_ridge<const P: usize>(x: &[[f64; P]], y: &[f64], alpha: f64) -> RidgeFit {
        let varying: Vec<usize> = (0..P)
            .filter(|&j| {
                x.iter()
                    .any(|r| (r[j] - x[0][j]).abs() > 1e-12 * x[0][j].abs().max(1.0))
            })
            .collect();
        let rows: Vec<Vec<f64>> = x
            .iter()
            .map(|r| varying.iter().map(|&j| r[j]).collect())
            .collect();
        let matrix = DenseMatrix::from_2d_vec(&rows).unwrap();
        let parameters = RidgeRegressionParameters::default()
            .with_alpha(alpha)
            .with_normalize(true)
            .with_solver(RidgeRegressionSolverName::Cholesky);
        let fitted = RidgeRegression::fit(&matrix, &y.to_vec(), parameters).unwrap();
        let mut coefficients = vec![0.0; P];
        for (k, &j) in varying.iter().enumerate() {
            coefficients[j] = *fitted.coefficients().get((k, 0));
        }
        RidgeFit {
            intercept: *fitted.intercept(),
            coefficients,
        }
    }

    fn data(n: usize, seed: u64) -> (Vec<[f64; 5]>, Vec<f64>) {
        let mut state = seed;
        let mut next = || {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut x = Vec::new();
        let mut y = Vec::new();
        for _ in 0..n {
            // Column 2 is constant; the others differ in scale by six orders of magnitude.
            let row = [
                next() * 1e6,
                next(),
                3.5,
                next() * 40.0 + 10.0,
                next() * 1e-3,
            ];
            y.push(2.0 + 1e-6 * row[0] - 0.7 * row[1] + 0.05 * row[3] + next() * 0.1);
            x.push(row);
        }
        (x, y)
    }

    #[test]
    fn streamed_sums_give_smartcores_ridge_with_constant_columns_zeroed() {
        for (n, alpha) in [(7, 1.0), (362, 1.0), (5_000, 0.1)] {
            let (x, y) = data(n, n as u64);
            let streamed = fit(alpha, || x.iter().copied().zip(y.iter().copied())).unwrap();
            let reference = smartcore_ridge(&x, &y, alpha);
            assert_eq!(streamed.coefficients[2], 0.0);
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1e-6);
            assert!(
                close(streamed.intercept, reference.intercept),
                "{n}: {streamed:?} vs {reference:?}"
            );
            for (a, b) in streamed.coefficients.iter().zip(&reference.coefficients) {
                assert!(close(*a, *b), "{n}: {streamed:?} vs {reference:?}");
            }
        }
    }

    #[test]
    fn too_few_rows_for_the_varying_columns_is_an_error() {
        let (x, y) = data(3, 1);
        assert!(fit(1.0, || x.iter().copied().zip(y.iter().copied())).is_err());
    }
}
