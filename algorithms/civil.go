package algorithms

import "math"

// Civil-date arithmetic on the proleptic Gregorian calendar, after Howard
// Hinnant's "chrono-Compatible Low-Level Date Algorithms". Days are counted
// from 1970-01-01 (day 0). Everything is float64 holding whole numbers, with
// math.Floor for every division, so that the Lua scripts (whose only number
// type is the double) compute the very same values.

// daysFromCivil returns the day number of year y, month m (1-12), day d (1-31).
func daysFromCivil(y, m, d float64) float64 {
	if m <= 2 {
		y--
	}
	era := math.Floor(y / 400)
	yoe := y - float64(era*400) // [0, 399]
	mp := m - 3
	if m <= 2 {
		mp = m + 9
	}
	doy := math.Floor((float64(153*mp)+2)/5) + d - 1                        // [0, 365]
	doe := float64(yoe*365) + math.Floor(yoe/4) - math.Floor(yoe/100) + doy // [0, 146096]
	return float64(era*146097) + doe - 719468
}

// civilFromDays returns the year, month (1-12) and day (1-31) of day number z.
func civilFromDays(z float64) (y, m, d float64) {
	z += 719468
	era := math.Floor(z / 146097)
	doe := z - float64(era*146097)                                                                         // [0, 146096]
	yoe := math.Floor((doe - math.Floor(doe/1460) + math.Floor(doe/36524) - math.Floor(doe/146096)) / 365) // [0, 399]
	y = yoe + float64(era*400)
	doy := doe - (float64(365*yoe) + math.Floor(yoe/4) - math.Floor(yoe/100)) // [0, 365]
	mp := math.Floor((float64(5*doy) + 2) / 153)                              // [0, 11]
	d = doy - math.Floor((float64(153*mp)+2)/5) + 1
	m = mp + 3
	if mp >= 10 {
		m = mp - 9
	}
	if m <= 2 {
		y++
	}
	return y, m, d
}

// weekday returns the day of the week of day number z, 0 = Sunday.
func weekday(z float64) float64 { return floorMod(z+4, 7) } // 1970-01-01 was a Thursday

func floorMod(a, b float64) float64 { return a - float64(math.Floor(a/b)*b) }
