-- 0038 down: scraping.idna_host and scraping.job_url_host as 0033 left them (an IPv6
-- host keyed as written, lowercased); scraping.ipv6_key dropped.

-- A host named by the worker (a pause, a redirect hop: ASCII, as requests sends it) as
-- the politeness limits key it: no trailing dot, no brackets around an IPv6 literal,
-- lowercased. (Its punycode of a non-ASCII name is not IDNA 2008's: intake no longer
-- uses it.)
CREATE OR REPLACE FUNCTION scraping.idna_host(p_host text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT AS $fn$
DECLARE
    v_host text := lower(rtrim(btrim(p_host), '.'));
    v_labels text[];
    v_out text[] := '{}';
    v_label text;
    cps integer[];
    n integer; delta bigint; bias integer; h integer; b integer; m integer;
    q bigint; k integer; t integer; v_enc text;
    first boolean;
BEGIN
    IF v_host LIKE '[%]' THEN
        v_host := substr(v_host, 2, length(v_host) - 2);
    END IF;
    IF v_host ~ '^[\x01-\x7f]*$' OR position(':' IN v_host) > 0 THEN
        RETURN v_host;
    END IF;
    v_labels := string_to_array(normalize(v_host, NFKC), '.');
    FOREACH v_label IN ARRAY v_labels LOOP
        IF v_label ~ '^[\x01-\x7f]*$' THEN
            v_out := v_out || v_label;
            CONTINUE;
        END IF;
        SELECT array_agg(ascii(c) ORDER BY o) INTO cps
        FROM unnest(string_to_array(v_label, NULL)) WITH ORDINALITY AS u(c, o);
        v_enc := '';
        FOR i IN 1..array_length(cps, 1) LOOP
            IF cps[i] < 128 THEN v_enc := v_enc || chr(cps[i]); END IF;
        END LOOP;
        b := length(v_enc);
        h := b;
        IF b > 0 THEN v_enc := v_enc || '-'; END IF;
        n := 128; delta := 0; bias := 72; first := true;
        WHILE h < array_length(cps, 1) LOOP
            SELECT min(c) INTO m FROM unnest(cps) AS c WHERE c >= n;
            delta := delta + (m - n)::bigint * (h + 1);
            n := m;
            FOR i IN 1..array_length(cps, 1) LOOP
                IF cps[i] < n THEN delta := delta + 1; END IF;
                IF cps[i] = n THEN
                    q := delta;
                    k := 36;
                    LOOP
                        t := CASE WHEN k <= bias THEN 1 WHEN k >= bias + 26 THEN 26
                                  ELSE k - bias END;
                        EXIT WHEN q < t;
                        v_enc := v_enc || scraping.punycode_digit((t + (q - t) % (36 - t))::integer);
                        q := (q - t) / (36 - t);
                        k := k + 36;
                    END LOOP;
                    v_enc := v_enc || scraping.punycode_digit(q::integer);
                    -- adapt the bias (RFC 3492 §6.1)
                    delta := CASE WHEN first THEN delta / 700 ELSE delta / 2 END;
                    delta := delta + delta / (h + 1);
                    k := 0;
                    WHILE delta > 455 LOOP
                        delta := delta / 35;
                        k := k + 36;
                    END LOOP;
                    bias := k + (36 * delta) / (delta + 38);
                    delta := 0;
                    first := false;
                    h := h + 1;
                END IF;
            END LOOP;
            delta := delta + 1;
            n := n + 1;
        END LOOP;
        v_out := v_out || ('xn--' || v_enc);
    END LOOP;
    RETURN array_to_string(v_out, '.');
END
$fn$;

-- A job's URL or callback as POST /jobs accepts it (pin_orchestration/scraping/hosts.py,
-- check_url, rule for rule), and its host key: at most 2048 characters; no whitespace or
-- control character; http(s)://, then an authority without userinfo or backslash: a name
-- of letters, digits, '-', '_' and dots (lowercased, its trailing dot dropped) or an IPv6
-- literal in brackets (lowercased, as written); a port of 1 to 5 digits, 1 to 65535.
-- SQLSTATE 22023 naming p_argument otherwise.
CREATE OR REPLACE FUNCTION scraping.job_url_host(p_url text, p_argument text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    v_bad text;
    v_parts text[];
    v_authority text;
    v_hostport text[];
    v_host text;
    v_port text;
BEGIN
    IF p_url IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', p_argument USING ERRCODE = '22023';
    END IF;
    IF length(p_url) > 2048 THEN
        RAISE EXCEPTION '% is longer than 2048 characters', p_argument USING ERRCODE = '22023';
    END IF;
    v_bad := substring(
        p_url FROM '[\x01-\x20\x7f-\x9f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]');
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION '% must not contain whitespace or control characters (found U+%): '
            'percent-encode it', p_argument, upper(lpad(to_hex(ascii(v_bad)), 4, '0'))
            USING ERRCODE = '22023';
    END IF;
    v_parts := regexp_match(p_url, '^[Hh][Tt][Tt][Pp][Ss]?://([^/?#]*)');
    IF v_parts IS NULL THEN
        RAISE EXCEPTION '% must be an http:// or https:// URL (got %)',
            p_argument, quote_literal(left(p_url, 80))
            USING ERRCODE = '22023';
    END IF;
    v_authority := v_parts[1];
    IF position('@' IN v_authority) > 0 THEN
        RAISE EXCEPTION '%: credentials in a URL are not accepted (remove the '
            'user:password@ part)', p_argument
            USING ERRCODE = '22023';
    END IF;
    IF position(E'\\' IN v_authority) > 0 THEN
        RAISE EXCEPTION '% has a backslash in its host: write / or percent-encode it',
            p_argument USING ERRCODE = '22023';
    END IF;
    v_hostport := regexp_match(v_authority, '^(\[[0-9A-Fa-f:]*\]|[^:\[\]]*)(?::([0-9]*))?$');
    IF v_hostport IS NULL THEN
        RAISE EXCEPTION '% has an invalid host or port: %', p_argument,
            quote_literal(left(v_authority, 80))
            USING ERRCODE = '22023';
    END IF;
    v_host := v_hostport[1];
    v_port := v_hostport[2];
    IF v_port <> '' AND (length(v_port) > 5 OR v_port::integer NOT BETWEEN 1 AND 65535) THEN
        RAISE EXCEPTION '% has an invalid port %: give 1 to 65535', p_argument,
            quote_literal(v_port)
            USING ERRCODE = '22023';
    END IF;
    IF v_host IN ('', '[]') THEN
        RAISE EXCEPTION '% has no host', p_argument USING ERRCODE = '22023';
    END IF;
    IF left(v_host, 1) = '[' THEN
        v_host := substr(v_host, 2, length(v_host) - 2);
        BEGIN
            IF family(v_host::inet) = 6 THEN
                RETURN lower(v_host COLLATE "C");
            END IF;
        EXCEPTION WHEN invalid_text_representation THEN
            NULL;
        END;
        RAISE EXCEPTION '% has an invalid IPv6 address %', p_argument,
            quote_literal(left(v_host, 80))
            USING ERRCODE = '22023';
    END IF;
    IF v_host ~ '^[A-Za-z0-9_-]{1,63}(\.[A-Za-z0-9_-]{1,63})*\.?$' THEN
        -- An IPv4 address in another spelling than a.b.c.d (getaddrinfo reads 0x7f.1 as
        -- 127.0.0.1): one address under many keys gets many rates.
        IF v_host ~ '^(0[xX][0-9A-Fa-f]*|[0-9]+)(\.(0[xX][0-9A-Fa-f]*|[0-9]+)){0,3}\.?$'
           AND v_host !~ ('^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}'
                          '(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.?$') THEN
            RAISE EXCEPTION '% has an IPv4 address not written as a.b.c.d (%): give four '
                'decimal numbers 0 to 255 without leading zeros', p_argument,
                quote_literal(left(v_host, 80))
                USING ERRCODE = '22023';
        END IF;
        RETURN rtrim(lower(v_host COLLATE "C"), '.');
    END IF;
    IF v_host ~ '^[\x01-\x7f]*$' THEN
        RAISE EXCEPTION '% has a host that is not a valid name (%): use letters, digits, '
            '''-'', ''_'' and dots, at most 63 characters between dots', p_argument,
            quote_literal(left(v_host, 80))
            USING ERRCODE = '22023';
    END IF;
    RAISE EXCEPTION '% has a host with non-ASCII characters (%): give it in its IDNA '
        'ASCII form (xn--..., as Python''s idna.encode writes it); POST /jobs takes either',
        p_argument, quote_literal(left(v_host, 80))
        USING ERRCODE = '22023';
END
$fn$;

DROP FUNCTION scraping.ipv6_key(text);
